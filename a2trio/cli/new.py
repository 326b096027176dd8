"""``python -m a2trio.new NAME`` (``a2trio new NAME``): start a project.

Writes a small app into ``./NAME``, a Python package: a contract and a handler
(``app.py``), a test on Trio's mock clock (``test_app.py``), a page that
pushes notes and follows them over SSE (``web/``), and a README with the two
commands that serve and test it, both run from the folder that holds
``NAME/``::

    a2trio serve NAME.app:server
    pytest NAME

The app serves and passes its test as written. The files come from the
templates in ``a2trio/templates/project/`` (package data), ``{{name}}``
replaced by NAME.

Exit status 0; 1 with one line when ``./NAME`` exists (nothing is written);
2 for a NAME that is no Python identifier, or that is already the name of an
importable module (the new package would shadow it, or it the package).
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import sys
from collections.abc import Iterator, Sequence
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath
from typing import Final

__all__ = ["main", "write_project"]

#: Where the templates live, under the a2trio package.
TEMPLATES: Final = ("templates", "project")
_SUFFIX: Final = ".tmpl"


def _templates(folder: Traversable, at: PurePosixPath) -> Iterator[tuple[PurePosixPath, str]]:
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            yield from _templates(entry, at / entry.name)
        else:
            yield at / entry.name.removesuffix(_SUFFIX), entry.read_text(encoding="utf-8")


def write_project(name: str, into: Path) -> list[Path]:
    """Write the starter app ``name`` into the new folder ``into / name``.

    Args:
      name: the package's name (a Python identifier; not checked here).
      into: the folder that will hold the package.

    Returns:
      The files written, in order.

    Raises:
      FileExistsError: ``into / name`` exists; nothing is written.
    """
    root = into / name
    root.mkdir()
    written = []
    for relative, text in _templates(files("a2trio").joinpath(*TEMPLATES), PurePosixPath()):
        path = root.joinpath(*relative.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{{name}}", name), encoding="utf-8")
        written.append(path)
    return written


def _taken(name: str) -> str | None:
    """What already answers to ``import name``, if anything. A namespace
    package does not count: a regular package anywhere on the path wins."""
    if name in sys.stdlib_module_names:
        return "the standard library"
    spec = importlib.util.find_spec(name)
    return None if spec is None else spec.origin


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m a2trio.new") -> int:
    """The command line; returns the exit status (``prog`` names it in usage
    lines: ``a2trio new`` runs this too)."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Start a project: write a small a2trio app into ./NAME."
    )
    parser.add_argument("name", metavar="NAME", help="the app's folder and package name")
    name: str = parser.parse_args(argv).name
    if not name.isidentifier() or keyword.iskeyword(name):
        parser.error(f"{name!r} is not a Python identifier (NAME is the app's package name)")
    if (Path.cwd() / name).exists():
        print(f"{prog}: ./{name} exists: not writing over it", file=sys.stderr)
        return 1
    taken = _taken(name)
    if taken is not None:
        parser.error(f"{name!r} is already a module ({taken}): pick another NAME")
    written = write_project(name, Path.cwd())
    print(f"wrote ./{name}: {', '.join(str(p.relative_to(Path.cwd() / name)) for p in written)}")
    print(f"serve it (then open http://127.0.0.1:8000/):  a2trio serve {name}.app:server")
    print(f"test it (pip install 'a2trio[testing]'):      pytest {name}")
    return 0

"""The command-line tools, and ``a2trio``: one console command for them.

::

    a2trio serve module:server [...]        python -m a2trio.serve
    a2trio inspect --app module:server ...  python -m a2trio.inspect
    a2trio new NAME                         python -m a2trio.new

Each subcommand hands the rest of the command line to that tool's ``main``,
so it behaves as the ``python -m`` form does, exit status included
(``python -m a2trio serve ...`` works as well). A tool is imported only
when it is named. The tools are :mod:`.serve`, :mod:`.inspect` and
:mod:`.new`; ``python -m a2trio.serve`` (``.inspect``, ``.new``) and
``python -m a2trio`` run them through the few-line modules kept at those
paths.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Final

__all__ = ["COMMANDS", "main"]

#: The subcommands and what each does, as ``a2trio --help`` lists them.
COMMANDS: Final = {
    "serve": "serve a module's servers over HTTP and sockets (python -m a2trio.serve)",
    "inspect": "an operator's view of an app's sessions, and repairs (python -m a2trio.inspect)",
    "new": "start a project: write a small app into ./NAME (python -m a2trio.new)",
}


def _tool(name: str) -> Callable[..., int]:
    if name == "serve":
        from . import serve

        return serve.main
    if name == "inspect":
        from . import inspect

        return inspect.main
    from . import new

    return new.main


def main(argv: Sequence[str] | None = None) -> int:
    """The ``a2trio`` command; returns the exit status.

    Args:
      argv: the arguments after the program name (default ``sys.argv[1:]``).

    Returns:
      The subcommand's exit status.

    Raises:
      SystemExit: 0 after ``--help``; 2 after a usage line on stderr for no
        subcommand or an unknown one (argparse's, as the tools' own).
    """
    parser = argparse.ArgumentParser(
        prog="a2trio",
        description="Durable, event-sourced sessions for Trio: the command-line tools.",
        epilog="commands:\n"
        + "\n".join(f"  {name:<9} {text}" for name, text in COMMANDS.items())
        + "\n\n`a2trio COMMAND --help` shows a command's own options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help="one of the below")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the command's own arguments")
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        parser.error(f"name a command: {', '.join(COMMANDS)}")
    args = parser.parse_args(argv)
    return _tool(args.command)(args.args, prog=f"a2trio {args.command}")

"""The engine: the runtime below the :class:`a2trio.Server` facade.

Sessions, the write path, drains and their handlers' attempts, abort,
presence, fan-out, actor calls and inspection. The server composes these
parts; none of them imports the server. ``docs/architecture.md`` draws the
modules' order (``tests/test_layering.py`` checks it). This package's
``__init__`` imports nothing: each part is imported from its module.
"""

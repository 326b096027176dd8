"""Helper processes for ``tests/test_sqlite_multiprocess.py``: run with
``python -m tests.sqlite_workers.<name>`` from the repository root."""

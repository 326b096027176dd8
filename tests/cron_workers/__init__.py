"""Helper processes for ``tests/test_crons.py``: run with
``python -m tests.cron_workers.<name>`` from the repository root."""

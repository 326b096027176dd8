"""Processes for ``tests/test_redis_multiprocess.py``.

The contract they share is ``tests/pg_workers/app.py``.
"""

"""Worker and writer processes for ``tests/test_postgres_multiprocess.py``."""

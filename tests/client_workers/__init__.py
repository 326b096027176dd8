"""The app ``tests/test_client_restart.py`` serves in a subprocess."""

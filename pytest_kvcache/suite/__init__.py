"""The stock probe tests, collected automatically when ``--kv-arms`` is given (not with --kv-no-suite)."""

"""Configuration: the option table, settings resolved once (CLI > env > ini/pyproject > default), arms,
and what the host CPU can serve. Plain Python, no I/O beyond reading what an option names."""

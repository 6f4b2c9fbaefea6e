"""The two kinds of failure the CLI reports: exit 2 for usage/config, 1 for runtime."""


class UsageError(Exception):
    """Bad arguments or configuration: `error: ...`, exit 2."""


class RuntimeFailure(Exception):
    """Something failed while running: `error: ...`, exit 1."""

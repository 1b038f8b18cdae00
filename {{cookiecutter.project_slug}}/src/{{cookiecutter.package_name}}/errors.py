"""The project's own exceptions; the entry points print each on one line, without a traceback."""


class ConfigError(ValueError):
    """Bad input from the user (a flag, a config key, a path, a checkpoint, an image)."""


class DivergedError(RuntimeError):
    """The training loss or the weights stopped being finite numbers."""

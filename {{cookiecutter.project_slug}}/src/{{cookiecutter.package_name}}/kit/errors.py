"""The project's own exceptions; the entry points print each on one line, without a traceback."""


class ConfigError(ValueError):
    """Bad input from the user (a flag, a config key, a path, a checkpoint, an image)."""


class DivergedError(RuntimeError):
    """The training loss or the weights stopped being finite numbers."""


def config_error_in(error: BaseException) -> ConfigError | None:
    """The ConfigError that led to `error`, if one did (jsonargparse wraps what a class raises)."""
    while error is not None and not isinstance(error, ConfigError):
        error = error.__cause__ or error.__context__
    return error


class UnreadableInputError(ValueError):
    """An input (a file to predict, a request's payload) that the project cannot read; the
    message says why, for the one who sent it."""


class InputTooLargeError(UnreadableInputError):
    """An input too large to read (a server answers 413)."""

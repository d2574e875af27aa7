"""Turning a user's mistake into one line on stderr instead of a traceback."""

from __future__ import annotations

import functools
import sys

from hydra.errors import InstantiationException

from numdev.attention.registry import BackendUnavailable

USER_ERRORS = (ValueError, FileNotFoundError, BackendUnavailable)


def user_facing(program: str):
    """Decorate a Hydra task function: user errors print `program: error: ...` and exit 2."""

    def decorate(task):
        @functools.wraps(task)
        def wrapper(*args, **kwargs):
            try:
                return task(*args, **kwargs)
            except InstantiationException as error:
                cause = error.__cause__ or error
                if not isinstance(cause, USER_ERRORS):
                    raise
                _exit(program, cause)
            except USER_ERRORS as error:
                _exit(program, error)

        return wrapper

    return decorate


def _exit(program: str, error: BaseException):
    print(f"{program}: error: {error}", file=sys.stderr)
    sys.exit(2)

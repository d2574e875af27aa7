"""numdev: does the numeric deviation of a training optimization matter?"""

__version__ = "0.1.0"

from numdev.config.resolvers import register as _register_resolvers  # noqa: E402

_register_resolvers()

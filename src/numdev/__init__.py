"""numdev: does the numeric deviation of a training optimization matter?"""

__version__ = "0.1.0"

from numdev.cli import script_entry as _script_entry  # noqa: E402, F401  first: Ctrl-C while a program of ours loads
from numdev.config.resolvers import register as _register_resolvers  # noqa: E402
from numdev.config.search_path import register as _register_search_path  # noqa: E402

_register_resolvers()  # the ${numdev_...} resolvers the configs use
_register_search_path()  # the config groups both apps share (conf/attention, conf/hydra)

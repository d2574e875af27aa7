"""numdev: does the numeric deviation of a training optimization matter?"""

__version__ = "0.1.0"

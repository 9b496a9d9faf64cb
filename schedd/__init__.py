"""schedd: a distributed job scheduler."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("schedd")
except PackageNotFoundError:  # run from a source tree that was not installed
    __version__ = "unknown"

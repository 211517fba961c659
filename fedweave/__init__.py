"""fedweave: federated and serverless learning where sites keep their data."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("fedweave")
except PackageNotFoundError:  # running from a source tree without install
    __version__ = "0.0.0+source"

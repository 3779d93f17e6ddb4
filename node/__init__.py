"""gradnode.node: the runtime of a peer (config, CLI, training, transport, swarm). Owns all I/O."""

from importlib import metadata

try:
    __version__ = metadata.version("gradnode")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+source"

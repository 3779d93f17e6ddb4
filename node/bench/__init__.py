"""gradnode.node.bench: benchmarks that print measured figures (codec, quality, swarm). Imports sim/
and below, never the CLI."""

"""gradnode.node: the runtime of a peer (config, CLI, training, transport, swarm). Owns all I/O."""

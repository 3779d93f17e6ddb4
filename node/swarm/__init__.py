"""gradnode.node.swarm: a peer among peers. Identity, the transport (the only hivemind importer),
membership records, the round exchange and its agreement, the round clock, state sync and catch-up,
the chores thread, and the peer loop that ties them to a training engine. Imports train/ and below."""

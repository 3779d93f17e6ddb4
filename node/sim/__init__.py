"""gradnode.node.sim: a whole swarm on one machine. Real peer processes started through the CLI,
link caps with network namespaces, and fault schedules. Imports swarm/ and below."""

"""The status page: the swarm's own records over time (watch.py), served as a small web dashboard (server.py)."""

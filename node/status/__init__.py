"""The status page: the swarm's own records over time (watch.py), a run's folder (runfolder.py), the figures both
share (figures.py), served as a small web dashboard (server.py)."""

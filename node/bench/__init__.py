"""gradnode.node.bench: benchmarks that print measured figures (codec, quality, swarm). Imports sim/
and below, never the CLI."""


def pyplot():  # type: ignore[no-untyped-def]
    """matplotlib.pyplot drawing to files (the Agg backend); ValueError when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'gradnode[plot]'") from None
    return plt

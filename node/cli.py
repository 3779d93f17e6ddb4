"""The `gradnode` command line. Imports nothing heavy at module level: `gradnode --help` stays fast.

Each command parses its options, loads the config and hands over to the module that does the work.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from gradnode.node.config import Config, ConfigError, load_config, parse_override

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="gradnode: decentralised SparseLoCo training over hivemind.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print measured figures.")
app.add_typer(bench_app, name="bench")

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML or TOML config; default: the embedded tiny-cpu preset.")
SetOpt = typer.Option(None, "--set", help="Override a config key, e.g. --set inner.lr=1e-3 (repeatable).")


def _load(config: Optional[Path], overrides: Optional[list[str]], extra: dict[str, Any] | None = None) -> Config:
    """Load the config, exit with the key-naming message on error (no traceback for user mistakes)."""
    try:
        pairs = dict(parse_override(o) for o in overrides or [])
        pairs.update(extra or {})
        return load_config(config, pairs)
    except ConfigError as err:
        typer.echo(str(err), err=True)
        raise typer.Exit(2) from None


def _setup_logging(verbose: bool) -> None:
    import logging

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


@app.command("check-config")
def check_config(config: Optional[Path] = ConfigOpt, set_: Optional[list[str]] = SetOpt) -> None:
    """Validate a config file and print the full resolved tree as JSON."""
    cfg = _load(config, set_)
    typer.echo(json.dumps(cfg.model_dump(mode="json"), indent=2))


# --- commands added by the layers below (codec, training, swarm) ---


def main() -> None:
    app()


if __name__ == "__main__":
    main()

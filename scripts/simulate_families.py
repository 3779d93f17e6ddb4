#!/usr/bin/env python
"""Every compressor family in a real 4-peer `gradnode simulate` (processes, hivemind, the embedded tiny
preset): does each end on identical weights, at what loss, and with how many update bytes a round?

    python scripts/simulate_families.py [--peers 4] [--rounds 3] [--family random-k ...]

Prints one markdown row per family setting, and exits 1 if any run ends on more than one hash.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time

# (label, --set overrides): each family the node runs, at the setting docs/compressors.md compares
RUNS = (
    ("sparseloco top64/4096 2b rice", ()),
    ("random-k 0.05 bf16", ("codec.family=random-k", "codec.options.density=0.05")),
    ("powersgd r2", ("codec.family=powersgd", "codec.options.rank=2")),
    ("sign /256", ("codec.family=sign", "codec.options.chunk=256")),
    ("dct-topk top64/4096 sign", ("codec.family=dct-topk",)),
    ("quant int8/64", ("codec.family=quant", "codec.options.bits=8")),
    ("quant int4/64", ("codec.family=quant", "codec.options.bits=4")),
    ("dense bf16", ("codec.family=dense", "codec.options.bits=16")),
)


def simulate(peers: int, rounds: int, overrides: tuple[str, ...]) -> dict:
    with tempfile.TemporaryDirectory(prefix="gn-families-") as out:
        cmd = ["gradnode", "simulate", "--peers", str(peers), "--rounds", str(rounds), "--json", "--clean",
               "--output-dir", f"{out}/run", *(a for o in overrides for a in ("--set", o))]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return json.loads(done.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--family", action="append", help="only the runs whose label starts with this")
    args = parser.parse_args()
    runs = [r for r in RUNS if not args.family or any(r[0].startswith(f) for f in args.family)]
    print("| compressor | peers | rounds | identical weights | val loss first -> last | KB down per peer a round "
          "| seconds |")
    print("|---|---|---|---|---|---|---|")
    split = False
    for label, overrides in runs:
        t0 = time.monotonic()
        d = simulate(args.peers, args.rounds, overrides)
        down = (d["traffic"].get("update_bytes_down") or {}).get("median", 0.0)
        same = d["identical_hashes"] and d["live_peers"] == args.peers
        split |= not same
        print(f"| {label} | {d['live_peers']}/{args.peers} | {d['rounds']} | {'yes' if same else 'NO'} | "
              f"{d['val_loss_first']:.3f} -> {d['val_loss_last']:.3f} | {down / 1000:.1f} | "
              f"{time.monotonic() - t0:.0f} |", flush=True)
    return 1 if split else 0


if __name__ == "__main__":
    sys.exit(main())

"""How the virtual simulator scales: `virtual.run(Scenario(peers=N, rounds=R, seed=S))` for each size, in
CPU-seconds of this process (the README's table in "Tests" and docs/notes/swarm.md's "Scale" come from it).

    python scripts/sim_sweep.py                      # 8x20 16x20 32x20 64x20 128x10 256x5 512x2
    python scripts/sim_sweep.py 64x20 512x1 --seed 3
"""

from __future__ import annotations

import argparse
import time

from gradnode.node.sim import virtual

SIZES = ("8x20", "16x20", "32x20", "64x20", "128x10", "256x5", "512x2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", default=list(SIZES), help="PEERSxROUNDS (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    print("| peers | rounds | events | CPU-s | CPU-s a round | violations (repaired) | hashes at the end |")
    print("|---|---|---|---|---|---|---|")
    for size in args.sizes:
        peers, rounds = (int(x) for x in size.split("x"))
        t0 = time.process_time()
        out = virtual.run(virtual.Scenario(peers=peers, rounds=rounds, seed=args.seed))
        cpu = time.process_time() - t0
        print(f"| {peers} | {rounds} | {out['events']:,} | {cpu:.2f} | {cpu / rounds:.3g} | {len(out['violations'])} "
              f"| {out['final_hashes']} |", flush=True)


if __name__ == "__main__":
    main()

"""Safety over many seeds: `gradnode simulate --virtual` for each seed of a range, with the same scenario, and the
seeds whose run applied a round two ways (a violation), ended on more than one hash, or stalled
(docs/benchmarks.md, "Safety sweeps", comes from it). Exits 1 when any seed fails.

    python scripts/safety_sweep.py --peers 16 --rounds 20 --seeds 0-199
    python scripts/safety_sweep.py --peers 64 --rounds 40 --seeds 11-30 --faults kill:3@r5,restart:3@r8
    python scripts/safety_sweep.py --peers 64 --rounds 40 --seeds 11 --halves 10-20   # a 32|32 split, healed
"""

from __future__ import annotations

import argparse
import sys
import time

from gradnode.node.sim import scenario, virtual


def seed_range(text: str) -> range:
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seeds", default="0-199", help="A-B, both included")
    ap.add_argument("--late-records", type=float, default=0.01)
    ap.add_argument("--faults", default="", help="as `simulate --virtual --faults`")
    ap.add_argument("--halves", default="", metavar="rA-rB", help="split the peers in two halves from round A, "
                                                                 "healed at round B")
    args = ap.parse_args()
    faults = [f for f in args.faults.split(",") if f]
    if args.halves:
        at, heal = args.halves.split("-")
        half = args.peers // 2
        groups = ",".join(map(str, range(half))), ",".join(map(str, range(half, args.peers)))
        faults += [f"partition:{groups[0]}|{groups[1]}@r{at}", f"heal@r{heal}"]
    spec = scenario.parse_faults(",".join(faults), args.peers) if faults else {}
    bad, violations, t0 = [], 0, time.process_time()
    seeds = seed_range(args.seeds)
    for seed in seeds:
        out = virtual.run(virtual.Scenario(peers=args.peers, rounds=args.rounds, seed=seed,
                                           late_p=args.late_records, **spec))
        violations += len(out["violations"])
        if out["violations"] or out["final_hashes"] != 1 or out["stalled"]:
            bad.append(f"seed {seed}: {len(out['violations'])} violations, {out['final_hashes']} hashes"
                       f"{', stalled' if out['stalled'] else ''}")
    print(f"{args.peers} peers x {args.rounds} rounds, seeds {args.seeds} ({len(seeds)}), late records "
          f"{args.late_records}, faults {','.join(faults) or 'none'}: {violations} violations, {len(bad)} seeds "
          f"failed, {time.process_time() - t0:.0f} CPU-s")
    for line in bad:
        print(" ", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

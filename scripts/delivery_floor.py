#!/usr/bin/env python
"""The floor of the virtual simulator's network at N peers: what delivering one round's records costs when every
record reaches every reader after a delay of its own, as `gradnode simulate --virtual` models the DHT
(node/sim/virtual.py ``_broadcast`` and ``_read_mail``: a latency and jitter draw, now and then a late one, the
reader's poll it falls in, a mailbox append; at the poll a sort and a call), with no round core, clock or rule
behind it. At 512 peers a round moves about 5.5 records per pair of peers (a member record and weight report
about 2.5 times, an announcement, a fetch's end, a report: measured on 512 x 2), so this loop alone bounds what
a round can cost while the simulator keeps a delay per record and reader (docs/notes/swarm.md, "Scale"). Usage:

    python scripts/delivery_floor.py --peers 128 256 512 --per-pair 5.5
"""

from __future__ import annotations

import argparse
import math
import random
import time


def one_round(n: int, per_pair: float, seed: int = 1) -> tuple[float, int]:
    """CPU-seconds to deliver ``per_pair`` records per pair of n peers (each record to the n - 1 others), and how
    many deliveries that is."""
    rng = random.Random(seed)
    draw = rng.random
    phases = [draw() * 0.2 for _ in range(n)]
    halves = [0.025 for _ in range(n)]
    mail: list[dict[int, list[tuple[float, int, int, object]]]] = [{} for _ in range(n)]
    writes = round(per_pair * n)  # records written in the round, each read by the n - 1 others

    def deliver(reader: int, t: float) -> None:
        pass

    t0 = time.process_time()
    seq = 0
    for w in range(writes):
        src, base = w % n, draw() * 10.0 + 0.025
        for q in range(n):
            if q == src:
                continue
            t = base + halves[q] + draw() * 0.05
            if draw() < 0.01:
                t += draw() * 8.0
            k = math.ceil((t - phases[q]) * 5.0)
            seq += 1
            box = mail[q].get(k)
            if box is None:
                mail[q][k] = [(t, seq, src, deliver)]
            else:
                box.append((t, seq, src, deliver))
    for q in range(n):
        for k in sorted(mail[q]):
            box = mail[q].pop(k)
            box.sort()
            for t, _, _, fn in box:
                fn(q, t)  # type: ignore[operator]
    return time.process_time() - t0, writes * (n - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", type=int, nargs="+", default=[128, 256, 512])
    ap.add_argument("--per-pair", type=float, default=5.5, help="records per pair of peers a round (default 5.5)")
    args = ap.parse_args()
    print("| peers | deliveries a round | CPU-s a round | 100 rounds |")
    print("|---|---|---|---|")
    for n in args.peers:
        cpu, moved = one_round(n, args.per_pair)
        print(f"| {n} | {moved:,} | {cpu:.2f} | {100 * cpu:.0f} s |", flush=True)


if __name__ == "__main__":
    main()

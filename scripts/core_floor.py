#!/usr/bin/env python
"""The floor of one round at N peers: N real round cores (protocol/round.py), each fed every other peer's
announcement, fetch, verification and report as the node feeds them (one event object per record and reader,
in a few polls), with no network, clock or simulator around them. What `gradnode simulate --virtual` can never
beat while the core takes one event per record and reader (docs/notes/swarm.md, "Scale"). Usage:

    python scripts/core_floor.py --peers 64 128 256 512 --polls 10
"""

from __future__ import annotations

import argparse
import time

from gradnode.protocol import round as core
from gradnode.protocol.records import pack

PARAMS = core.Params(min_deadline_s=2.0, deadline_slack=1.5, commit_grace_s=3.0, max_wait_s=60.0)


def one_round(n: int, polls: int) -> tuple[float, int, int]:
    """CPU-seconds for n cores to take one round's events and decide; the events; the cores that decided."""
    peers = [f"p{i:04d}" for i in range(n)]
    records = {p: (1, True) for p in peers}
    cores = []
    for me in peers:
        c = core.RoundCore(PARAMS, 1, me, frozenset(peers), True, "base", 2.0, 0.0)
        c.step(core.Members(0.0, core.view_of(records, me, 1, workers=peers)))
        c.own_update(0.0, "d" + me)
        cores.append(c)
    fps = pack((p, "d" + p) for p in peers)
    reports = {p: core.Report(p, "base", fps, digest=fps) for p in peers}
    chunk = max(1, n // polls)
    events = 0
    start = time.process_time()
    for k in range(0, n, chunk):  # the updates reach every peer in `polls` polls
        t, part = 0.1 + k / n, peers[k:k + chunk]
        for c in cores:
            batch = [e for s in part if s != c.me
                     for e in (core.Announced(t, s, t), core.FetchStarted(t, s), core.Verified(t, s, "d" + s))]
            events += len(batch)
            if batch:  # a poll that brought only its own update brings nothing
                c.steps(batch)
    for k in range(0, n, chunk):  # then the reports
        t, part = 2.0 + k / n, peers[k:k + chunk]
        for c in cores:
            batch = [core.ReportSeen(t, reports[s]) for s in part if s != c.me]
            events += len(batch)
            if batch:
                c.steps(batch)
    return time.process_time() - start, events, sum(c.phase is core.Phase.DECIDED for c in cores)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", type=int, nargs="+", default=[64, 128, 256, 512])
    ap.add_argument("--polls", type=int, default=10, help="polls in which a round's updates, then reports, arrive")
    args = ap.parse_args()
    print("| peers | events | CPU-s a round | us an event | decided |")
    print("|---|---|---|---|---|")
    for n in args.peers:
        cpu, events, decided = one_round(n, args.polls)
        print(f"| {n} | {events:,} | {cpu:.2f} | {1e6 * cpu / events:.2f} | {decided} of {n} |")


if __name__ == "__main__":
    main()

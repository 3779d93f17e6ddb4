"""The virtual simulator's network (node/sim/virtual.py): the DHT's and the streams' delays, shared links,
a split and clogged links. ``Network`` is a part of ``virtual.Simulation``: its methods use the simulation's
clock, peers and links.

- The DHT and the streams are one delay per delivery. Every record a peer writes reaches each other peer
  ``latency + jitter`` later, and with probability ``late_p`` much later (``late_s``: the DHT hid a stored
  record from one reader for a while, as the real one does). A key's newest value wins: a late copy of an
  older record changes nothing.
- A peer reads what reached it at its polls (every ``round.POLL_S``, at a phase of its own): records,
  announcements, reports and its fetches' ends, in the order they came. Each of its round cores takes one
  poll's events as one batch, as agreement.Agreement feeds the same core. A split between reader and writer
  at the poll loses what came; a clogged link holds it.
- The poll that reads an announcement starts the update's fetch, and the first poll after it ended verifies
  it (exchange.RoundExchange starts and reaps its fetches so). Each link has its own bandwidth and latency
  (``link_spread``) and carries one transfer at a time; a lost attempt (``loss_p``) is tried again.
- A partition (``Scenario.partition``) cuts every delivery between its groups from the first announcement
  of round ``partition_at`` to the first of ``heal_at``: records in flight are lost, the other side's
  records go stale, and each side trains on as its own swarm.
- Swizzle-clogging (``Scenario.swizzle_at``) clogs a random half of the links one by one, then unclogs them.
"""

from __future__ import annotations

import math
import random
from typing import Any, Callable

from gradnode.node.sim import sizes
from gradnode.node.sim.vpeer import VPeer
from gradnode.protocol import round as core
from gradnode.protocol.gossip import holdings_part, holdings_parts, part_of

RETRY_S = 1.0  # a lost transfer is noticed and retried this much later (the transport's timeout and retry)
POLLS_PER_S = 1 / core.POLL_S  # a peer's polls of the DHT a second (it reads what reached it at each, _read_mail)


class Network:
    """How records and updates travel between the simulation's peers."""
    def _delay(self, a: str | None = None, b: str | None = None) -> float:
        """A record's way from peer a to peer b (the DHT: their links' latency, jitter, and now and then late)."""
        d = self._latency(a, b) + self.rng.random() * self.sc.jitter_s
        if self.rng.random() < self.sc.late_p:
            d += self.rng.random() * self.sc.late_s
        return d

    def _latency(self, a: str | None, b: str | None) -> float:
        return (self.lat[a] + self.lat[b]) / 2 if a in self.lat and b in self.lat else self.sc.latency_s

    def _transfer_s(self, a: str | None, b: str, size: int) -> float:
        """How long ``size`` bytes take from a to b (a None: from any donor, at b's own link): the slower link's
        bandwidth after their latency, again after RETRY_S for each attempt lost (``loss_p``)."""
        once = size * 8 / min(self.bw.get(a, math.inf), self.bw[b])
        t = self._latency(a, b) + once
        while self.sc.loss_p and self.loss.random() < self.sc.loss_p:
            t += RETRY_S + once
        return t

    def _linked(self, a: VPeer, b: VPeer) -> bool:
        return (self.group is None or self.group[a.id] == self.group[b.id]) and frozenset((a.id, b.id)) not in self.clogged

    def _broadcast(self, src: VPeer, deliver: Callable[[VPeer, float], None]) -> None:
        """Every other peer gets it after a delay, at its first poll since (``_post``)."""
        # _delay's draws and _post, inlined: N - 1 of them per record, the simulator's busiest loop
        random, jitter, late_p, late_s = self.rng.random, self.sc.jitter_s, self.sc.late_p, self.sc.late_s
        ceil, at, read, seq, poll_s = math.ceil, self.at, self._read_mail, self._seq, core.POLL_S
        base = self.now + self.lat[src.id] / 2  # every peer has a link (_latency)
        for q, half, phase in self._reach:
            if q is not src:
                t = base + half + random() * jitter
                if random() < late_p:
                    t += random() * late_s
                k = ceil((t - phase) * POLLS_PER_S)
                if phase + k * poll_s < t:  # rounding: never read before it arrives
                    k += 1
                seq += 1
                box = q.mail.get(k)
                if box is None:
                    q.mail[k] = [(t, seq, src, deliver)]
                    at(phase + k * poll_s, read, q, k)
                else:
                    box.append((t, seq, src, deliver))
        self._seq = seq

    def _post(self, q: VPeer, t: float, src: VPeer | None, deliver: Callable[[VPeer, float], None]) -> None:
        """What reaches q at time t (from ``src``; None: a transfer of its own, which no split or clog stops
        once begun) is read at q's first poll since: q reads the DHT and its streams every ``round.POLL_S``, at a
        phase of its own, and takes what came since its last poll in the order it came (``_read_mail``)."""
        phase = self._phase[q.id]
        k = math.ceil((t - phase) * POLLS_PER_S)
        if phase + k * core.POLL_S < t:  # rounding: never read before it arrives
            k += 1
        self._seq += 1
        box = q.mail.get(k)
        if box is None:
            q.mail[k] = [(t, self._seq, src, deliver)]
            self.at(phase + k * core.POLL_S, self._read_mail, q, k)
        else:
            box.append((t, self._seq, src, deliver))

    def _read_mail(self, q: VPeer, k: int) -> None:
        """q's poll ``k``: what reached it since the last one, delivered as it came (a split between q and its
        writer now: lost; their link clogged now: held until it unclogs), then each round core that got events
        takes them as one batch and decides once, at the poll's time (the node's agreement reads the DHT every
        round.POLL_S and feeds its core one poll at a time)."""
        box = q.mail.pop(k, None)
        if box is None or not q.alive:
            return
        batches: dict[int, tuple[core.RoundCore, list[Any]]] = {}
        self._batch, self._taking = batches, {}
        group, clogged = self.group, self.clogged
        box.sort()  # (time, seq, ...): seq is unique, so the callables are never compared
        for t, _, src, deliver in box:
            if src is not None:
                if group is not None and group[src.id] != group[q.id]:
                    continue
                if clogged:
                    link = frozenset((src.id, q.id))
                    if link in clogged:
                        self.held[link].append((q, src, deliver))
                        continue
            deliver(q, t)
        for r, read in self._taking.items():  # a committee's round: the announcements read, taken together
            self._take(q, r, read)
        self._batch = None
        for c, events in batches.values():
            if q.alive and q.cores.get(c.round_) is c:
                self._act(q, c, c.steps([*events, core.Tick(self.now)]))

    def _swizzle(self) -> None:
        """Clog a random half of the links one by one, then unclog them one by one in another order."""
        self.swizzled = True
        rng = random.Random(f"{self.sc.seed}/swizzle")
        names = sorted(self.peers)
        links = [frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1:] if rng.random() < 0.5]
        rng.shuffle(links)
        step = self.sc.swizzle_s
        for i, link in enumerate(links):
            self.at(self.now + i * step, lambda link=link: self.clogged.add(link))
        rng.shuffle(links)
        start = self.now + len(links) * step
        for i, link in enumerate(links):
            self.at(start + i * step, lambda link=link: self._unclog(link))
        self.unclogged_at = start + max(0, len(links) - 1) * step

    def _unclog(self, link: frozenset[str]) -> None:
        self.clogged.discard(link)
        if self.now >= self.unclogged_at:
            self.unclog_round = max(p.newest for p in self.peers.values())
        for q, src, deliver in self.held.pop(link, []):
            self._post(q, self.now + self._delay(src.id, q.id), src, deliver)

    def _split_or_heal(self, r: int) -> None:
        """The split falls at the first announcement of round ``partition_at`` and heals at the first of ``heal_at``
        (or ``heal_after_s`` after it fell)."""
        if self.sc.partition and self.group is None and not self.healed and r >= self.sc.partition_at:
            self.group = {f"p{i:04d}": n for n, g in enumerate(self.sc.partition) for i in g}
            others = [i for i in range(self.sc.peers) if f"p{i:04d}" not in self.group]
            self.group.update({f"p{i:04d}": 0 for i in others})  # peers in no group stay with the first
            if self.sc.heal_after_s >= 0:
                self.at(self.now + self.sc.heal_after_s, self._heal)
        elif self.group is not None and 0 <= self.sc.heal_at <= r:
            self.group, self.healed = None, True
        if 0 <= self.sc.swizzle_at <= r and not self.swizzled:
            self._swizzle()

    def _heal(self) -> None:
        self.group, self.healed = None, True
        self.healed_round = max((p.newest for p in self.peers.values()), default=0)

    def _fetch(self, p: VPeer, q: VPeer, r: int, digest: str) -> tuple[float, str]:
        """When q's fetch of p's update of round r ends, and from whom. The sender serves its copies within its
        budget (protocol/gossip.py: ``own_copies`` a window); past them q fetches from a random peer in its reach
        that holds a copy (the node's holdings: those of its part), or, while none does yet, from one of the
        copies under way, picked at random, once it has arrived (the node's fetcher, told 'busy', tries the
        holders again as they list their copies; queued on the first copy alone, the fetchers of a 256-peer
        round waited in one line behind one uplink). Each link carries one transfer at a time at its full
        speed: a transfer begins once the uploader's and the downloader's earlier ones ended (their sum is
        what shared links take), and is tried again after RETRY_S for each attempt lost (``loss_p``).
        q also reads the round's holdings."""
        via, ready = p.id, self.now
        roster = self._roster(q)
        part = holdings_part(q.id, roster)
        if not self.copies.take(digest, self.now):
            # the holders of q's part, on q's roster (each holder's own is a sight of N records to rebuild)
            reach = [(t, h) for t, h in self._holders_in(digest, roster, part)
                     if self.peers[h].alive and self._linked(self.peers[h], q)]
            held = [h for t, h in reach if t <= self.now]
            if held:
                via = held[self.sources.randrange(len(held))]
            elif reach:  # none holds it yet: wait for one of the copies under way, picked at random
                ready, via = reach[self.sources.randrange(len(reach))]
        if q.holdings_read != (r, self.now):  # the fetches a poll starts share one read (transport.READ_SHARE_S)
            q.holdings_read = (r, self.now)
            q.traffic.read("holdings", self.holding_writers[r, part], sizes.holdings(len(q.announcers_of.get(r, ()))))
        size = self.sc.update_bytes
        begin = max(ready, self.up_free[via], self.down_free[q.id])
        self.up_free[via] = self.down_free[q.id] = begin + size * 8 / min(self.bw[via], self.bw[q.id])
        t = begin + self._transfer_s(via, q.id, size)
        if p.lie != "withhold":  # nobody holds what its sender never served
            self.holders[digest].append((t, q.id))
            for parts, index in self.holders_by_part[digest].items():
                index.setdefault(part_of(q.id, parts), []).append((t, q.id))
        return t, via

    def _holders_in(self, digest: str, roster: int, part: int | None) -> list[tuple[float, str]]:
        """The holders of ``digest`` under ``part`` of a roster of ``roster`` keys, in the order they came: one list
        per part, kept as holders come, not a pass over every holder per fetch (N of them, N fetchers a round)."""
        parts = holdings_parts(roster)
        index = self.holders_by_part[digest].get(parts)
        if index is None:
            index = self.holders_by_part[digest][parts] = {}
            for t, h in self.holders[digest]:
                index.setdefault(part_of(h, parts), []).append((t, h))
        return index.get(part, [])

    def _part(self, q: VPeer) -> int | None:
        """The part of a round's holdings q lists its copies under and reads (gossip.holdings_part), on the
        roster in its sight."""
        return holdings_part(q.id, self._roster(q))

    def _fetched(self, q: VPeer, r: int, p: VPeer, digest: str, now: float, via: str) -> None:
        """q's fetch of p's update of round r ended at ``now``: verified, or without the bytes (a withholder's).
        A verified update is held and served on, and q lists its holdings once per poll that verified one."""
        if p.lie == "withhold":
            self._deliver(q, r, core.FetchEnded(now, p.id))
            return
        size = self.sc.update_bytes
        q.traffic.update_bytes_down += size
        self.peers[via].traffic.update_bytes_up += size
        q.traffic.hold(self.blob_cap)
        if q.holdings_at != (r, self.now):
            if q.holdings_at[0] != r:
                self.holding_writers[r, self._part(q)] += 1
            q.holdings_at = (r, self.now)
            q.traffic.records_written += 1
        self._deliver(q, r, core.Verified(now, p.id, digest))

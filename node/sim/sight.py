"""What a peer of the virtual simulator (node/sim/virtual.py) sees and reads: the member records, its view of
a round, the pace, and the DHT reads it counts. ``Sight`` is a part of ``virtual.Simulation``.

Every peer publishes the tail of its chain after each round and every heartbeat (``min(10 s, record_ttl_s /
3)``). A peer's view of the swarm (``core.View``: who is live, present, two rounds ahead) is the records it saw
within ``record_ttl_s``, re-read at least every heartbeat while a round waits.

A record also claims its writer's round time (its last round's seconds a step times ``inner_steps``: a member
record's step_seconds). A peer paces a round (its deadline window, its cut time) on the lower median of the
claims in its sight of the last round's senders, its own time before it applied one (``round.pace``). It reads
the pace when it sets out to compute the round and when its core opens. Nobody is handed the swarm's true pace.

A peer reads the DHT by polling, and a read of a key returns every value under it. ``traffic`` counts its
reads, each returning what had reached the reader by then: the member records every MEMBERS_READ_S plus a
read; while its inner steps of a round run, that round's announcements every POLL_S plus a read (the round
clock's watcher); while it decides one, its announcements and reports every round.POLL_S plus two reads (the
agreement's poll), and the reports once more when it settles; a round's weight reports at its hash check; the
round's holdings at each poll that starts a fetch (``Network._fetch``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from gradnode.node.sim import sizes
from gradnode.node.sim.content import update_digest
from gradnode.node.sim.vpeer import TAIL, VPeer
from gradnode.protocol import chain, committee
from gradnode.protocol import round as core
from gradnode.protocol import roster, votes

PACE_LIE_S = 3600.0  # the round time a 'stretch' liar's records claim
FUTURE_ROUNDS = 10**6  # how far past its newest round a 'futurestate' liar's records claim a state (adversary.py)
POLL_S = 0.5  # how often a computing peer reads the announcements for its cut time (clock.RoundClock.POLL_S)
MEMBERS_READ_S = 0.5  # how often a running peer reads the member records (Membership.members: max_age)


class Sight:
    """Member records written and read, each peer's view of them, and the reads counted."""
    def _publish_record(self, p: VPeer, hashes: tuple[tuple[int, str], ...] = ()) -> None:
        """Its member record (its chain's tail) and its state offer reach the others, with its weight reports of
        the rounds ``hashes`` names (round, hash) after an apply or an adoption (one write of the node's chores
        thread: the weight report, the state offer, the member record); it holds them itself."""
        hashes = tuple((k, h) for k, h in hashes if self._weighs(p, k))  # a committee's: committee.weighers
        tail, chain_ = p.tail(), dict(p.hashes)
        if p.lie == "futurestate" and tail and tail[-1][0] >= self.sc.lies_from:  # a state far ahead, claimed
            far = tail[-1][0] + FUTURE_ROUNDS
            chain_[far] = update_digest(p.id, far, tail[-1][1])[:16]
            tail += ((far, chain_[far]),)
            self.fakes.add(tail[-1])
        if p.offer is None or p.offer[0] != tail:
            p.offer = (tail, chain_, dict(p.applied), dict(p.ledger), p.reputation, dict(p.pools))
        record = (tail, p.offer, PACE_LIE_S if p.lie == "stretch" else p.step_s * self.sc.inner_steps)
        self._read_members(p)
        listed = self._listed(p)
        p.hold(p.id, (self.now, *record))
        # with a weight report and a state offer; under a committee, its own key's copy too
        p.traffic.records_written += listed + self.budget.drawn + 2 * bool(hashes)
        for k, h in hashes:
            p.weights[k][p.id] = h
        if not listed:  # under its own key only: nobody's view counts it (roster.lists)
            if hashes:
                self._send_weights(p, hashes)
            return

        sent = self.now

        def deliver(q: VPeer, now: float) -> None:
            stamps = q.stamps  # _newest inlined for the record (one per record and reader)
            if stamps.get(p.id, -1.0) < sent:
                stamps[p.id] = sent
                q.hold(p.id, (now, *record))
            for k, h in hashes:
                if keeps_newest(q, (p.id, k), sent):
                    q.weights[k][p.id] = h

        self._broadcast(p, deliver)

    def _send_weights(self, p: VPeer, hashes: tuple[tuple[int, str], ...]) -> None:
        """p's weight reports of ``hashes`` reach the others, without its member record."""
        sent = self.now

        def deliver(q: VPeer, now: float) -> None:
            for k, h in hashes:
                if keeps_newest(q, (p.id, k), sent):
                    q.weights[k][p.id] = h

        self._broadcast(p, deliver)

    def _listed(self, p: VPeer) -> bool:
        """Whether p's member record goes in the member table now (``roster.listed``, as the node's)."""
        return roster.listed(p.lists)

    def _weighers(self, p: VPeer, r: int) -> frozenset[str] | None:
        """Whose weight hashes of round r count for p, and so who publishes one (``committee.weighers`` of the
        committee p draws for r and the set it applied; None: every voter's)."""
        return committee.weighers(self._committee(p, r), p.sets.get(r))

    def _weighs(self, p: VPeer, r: int) -> bool:
        among = self._weighers(p, r)
        return among is None or p.id in among

    def _heartbeat(self, p: VPeer, incarnation: int | None = None) -> None:
        if p.done or not p.alive or (incarnation is not None and incarnation != p.incarnation):
            return
        self._publish_record(p)
        self.at(self.now + self.heartbeat_s, lambda i=p.incarnation: self._heartbeat(p, i))

    def _sybil_beat(self) -> None:
        """The sybil keys' heartbeat: member records on a chain of made-up hashes at the swarm's newest round (or
        ``sybils_ahead`` rounds past it), and weight reports of those hashes, to every live peer (records and
        reports only: they run no core)."""
        newest = max((max(p.hashes) for p in self.peers.values() if p.alive and not p.lie), default=-1)
        if newest < 0 and self.now > 0 and all(p.done for p in self.peers.values()):
            return
        top = newest + self.sc.sybils_ahead
        tail = tuple((k, f"sybil{k}") for k in range(max(0, top - TAIL + 1), top + 1))
        for i in range(self.sc.sybils):
            sid = f"s{i:04d}"
            for q in self.peers.values():
                def deliver(q: VPeer = q, sid: str = sid) -> None:
                    if q.alive:
                        q.hold(sid, (self.now, tail, None, self.sc.sybil_pace_s))  # no state offered
                        for k, h in tail:
                            q.weights[k][sid] = h
                self.at(self.now + self._delay(), deliver)
        if not all(p.done or not p.alive for p in self.peers.values()):
            self.at(self.now + self.heartbeat_s, self._sybil_beat)

    def _fresh(self, p: VPeer, q: str, seen: float) -> bool:
        """q's record, which reached p at ``seen``, has not expired on p's clock: it expires ``record_ttl_s``
        after q wrote it, on q's clock (a writer whose clock is behind writes records that expire early)."""
        return self.now - seen < self.sc.record_ttl_s + self.off.get(q, 0.0) - self.off[p.id]

    def _votes(self, p: VPeer) -> Callable[[str], bool]:
        """Whose chain and weight reports count for p (Membership.votes): ``VPeer.voters``; everyone's before it
        applied a round, or under ``votes='everyone'``."""
        return _everyone if p.voters is None else p.voters.__contains__

    def _revote(self, p: VPeer) -> None:
        """p's voters anew, after its ledger or the senders it verified changed (protocol/votes.py; ``votes``:
        'ledger', the ledger alone; 'everyone': None)."""
        if self.sc.votes == "everyone" or not p.ledger:
            p.voters = None
        elif self.sc.votes == "ledger":
            p.voters = frozenset(p.ledger)
        else:
            found = votes.voters(p.ledger, p.workers, max(p.hashes), p.reputation.banned())
            top = max(p.hashes) + 1  # the round it computes or decides: its last rounds' committees, as the node's
            recent = [c.committee for k, c in p.cores.items() if top - roster.VOTE_ROUNDS < k <= top]
            p.voters = roster.sampled(found, recent, p.senders)

    def _tails(self, p: VPeer, with_me: bool = True, voting: bool = True) -> dict[str, tuple[chain.Link, ...]]:
        """The tails of the member records in p's sight (seen within the records' ttl), its own included; with
        ``voting``, only those of keys whose vote counts (``_votes``)."""
        out = self._sight(p)[0]
        if voting and p.voters is not None:
            out = {q: t for q, t in out.items() if q in p.voters}
        else:
            out = dict(out)  # the sight's own dict changes as records come (_sight)
        if with_me:
            out[p.id] = p.tail()
        return out

    def _sight(self, p: VPeer) -> tuple[dict[str, tuple[chain.Link, ...]], dict[str, tuple[int, bool]]]:
        """The other peers' member records in p's sight: their tails, and what round.view_of reads of them (the
        round after the last each tail names, training). Every poll of every peer reads them, and most polls come
        between two changes: a reading is kept and brought up to date with the records that changed since
        (``VPeer.changed``), and read anew once one of its records expires."""
        got = p.sight
        if got is None or self.now >= got[0]:
            return self._read_sight(p)
        if p.changed:
            now, ttl, off, me = self.now, self.sc.record_ttl_s, self.off, p.id
            mine, tails, rounds, moves = off[me], got[1], got[2], p.moves
            for q in p.changed:
                rec = p.records.get(q) if q != me else None  # p's own record is never in its sight
                life = ttl + off.get(q, 0.0) - mine
                if rec is not None and now - rec[0] >= life:  # came expired (its writer's clock far behind)
                    del p.records[q]
                    rec = None
                if rec is None:  # its writer left, or its record expired: gone, as _read_sight drops it
                    tails.pop(q, None)
                    if rounds.pop(q, None) is not None:
                        moves.append(q)
                    continue
                seen, t = rec[0], rec[1]
                tails[q] = t
                at = (t[-1][0] + 1 if t else 0, True)
                if rounds.get(q) != at:
                    rounds[q] = at
                    moves.append(q)
                got[0] = min(got[0], seen + life - 1e-9)
            p.changed.clear()
            if len(moves) > 2 * len(rounds) + 64:  # the kept views would replay more than a view anew reads
                return self._read_sight(p, keep_views=False)
        return got[1], got[2]

    def _read_sight(self, p: VPeer, keep_views: bool = True) -> tuple[dict[str, tuple[chain.Link, ...]],
                                                                     dict[str, tuple[int, bool]]]:
        """All of p's member records read anew (``_sight``): the expired ones dropped (only a newer record of
        their writer brings one back), the others' tails and rounds, and when the first of them expires. The
        writers whose rounds differ from the last reading are p's ``moves``, for the views it keeps; with no
        last reading, or not ``keep_views``, the views are made anew."""
        # _fresh inlined (the same sums): a record expires record_ttl_s after it was written, on its writer's clock
        now, ttl, off, me = self.now, self.sc.record_ttl_s, self.off, p.id
        mine = off[me]
        tails, expires, gone = {}, math.inf, []
        for q, (seen, t, _, _) in p.records.items():
            life = ttl + off.get(q, 0.0) - mine
            if now - seen >= life:
                gone.append(q)  # expired: only a newer record of q brings it back
            elif q != me:
                tails[q] = t
                if seen + life < expires:
                    expires = seen + life
        for q in gone:
            if q != me:
                del p.records[q]
        rounds = {q: (t[-1][0] + 1 if t else 0, True) for q, t in tails.items()}
        was = p.sight[2] if p.sight is not None and keep_views and len(p.moves) <= 2 * len(rounds) + 64 else None
        if was is None:
            p.sight_epoch, p.moves = p.sight_epoch + 1, []
        elif was != rounds:
            p.moves += [q for q in was.keys() | rounds.keys() if was.get(q) != rounds.get(q)]
        # kept until a nanosecond before the first expiry: the test above is a difference, the expiry a sum
        p.sight = [expires - 1e-9, tails, rounds]
        p.changed.clear()
        return tails, rounds

    def _roster(self, p: VPeer) -> int:
        """The live keys p counts, itself included (the node's ``Membership.roster``): the records in its sight,
        or under a committee its estimate (``roster.Roster``) on its ledger's size."""
        seen = 1 + len(self._sight(p)[0])
        return p.roster.size(len(p.ledger), seen) if self.budget.drawn else seen

    def _pace(self, p: VPeer) -> float:
        """p's round time (``round.pace``, which Clock.round_seconds reads too): the lower median of the round
        times that the member records in its sight claim, of the last round's senders (of every record in sight
        under ``pace='everyone'``), its own time counted as it measured it; before it applied a round, its own
        time (``min_deadline_s`` before it computed one)."""
        own = p.step_s * self.sc.inner_steps
        records, sight = p.records, self._sight(p)[0]
        everyone = self.sc.pace == "everyone"
        claims = {q: records[q][3] for q in (sight if everyone else p.senders) if q in sight}
        claims[p.id] = own
        return core.pace(claims, claims.keys() if everyone else p.senders, own or self.sc.params.min_deadline_s)

    def _read_members(self, p: VPeer) -> None:
        """The member records p read since the last count: its sight's records, every MEMBERS_READ_S."""
        if p.alive:
            every = MEMBERS_READ_S + self.sc.dht_read_s
            p.traffic.read("members", (1 + len(self._sight(p)[0])) * (self.now - p.members_read) / every,
                       sizes.member(TAIL))
        p.members_read = self.now

    def _announcements_read(self, p: VPeer, r: int, since: float, every: float, until: float | None = None) -> float:
        """Round r's announcements that p's reads every ``every`` seconds from ``since`` until ``until`` (now)
        returned: each one from its first sighting on (a read returns what reached p by then)."""
        until = self.now if until is None else until
        return sum(max(0.0, until - max(t, since)) for t in self._announced(p, r).values()) / every

    def _read_while_computing(self, p: VPeer, r: int) -> None:
        """While its inner steps of round r ran, p read r's announcements every POLL_S from their start (the round
        clock's watcher, closed when they end), and r - 1's too until half the trainers in its sight had announced
        r (clock.CutTime predicts the cut time from the round before)."""
        since = p.compute_from.get(r)
        if since is None:
            return
        every = POLL_S + self.sc.dht_read_s
        first = self._announced(p, r)
        read = self._announcements_read(p, r, since, every) + sum(t <= since for t in first.values())
        if r > 0:
            times = sorted(first.values())
            need = (len(self._sight(p)[0]) + 1) // 2
            anchor = times[need - 1] if 0 < need <= len(times) else self.now
            until = min(self.now, max(since, anchor))
            read += self._announcements_read(p, r - 1, since, every, until=until) + len(self._announced(p, r - 1))
        p.traffic.read("updates", read, sizes.announcement())

    def _read_while_deciding(self, p: VPeer, c: core.RoundCore) -> None:
        """From its core's opening to its decision p polled every round.POLL_S: the round's announcements and its
        reports, each from when it reached p on (a read returns what reached p by then; its own report, from when
        it published it)."""
        every = core.POLL_S + 2 * self.sc.dht_read_s
        r, now = c.round_, self.now
        seen = self._announcements_read(p, r, c.start, every) + len(self._announced(p, r))
        p.traffic.read("updates", seen, sizes.announcement())
        came = p.reports_at.get(r, {})
        if p.id in c.reports:
            came = {**came, p.id: c.reported_at}
        polls = sum(max(0.0, now - max(t, c.start)) for t in came.values()) / every + len(came)
        p.traffic.read("reports", polls, sizes.report(len(c.first_seen)))

    def _announced(self, p: VPeer, r: int) -> dict[str, float]:
        """Who announced round r in p's sight, first seen when: its core's sightings and the records it holds."""
        c = p.cores.get(r)
        first = dict(p.announcers_of.get(r, ()))
        if c is not None:
            first.update(c.first_seen)  # the core's sighting first (read by value: its order matters nowhere)
        return first

    def _view(self, p: VPeer, r: int) -> core.View:
        """What p's member records say, by the node's rule (``round.view_of``): the peers whose record it saw
        within the ttl (a split hides the others once theirs go stale), each at the round after the last its
        tail names; the last round p applied's senders and this round's announcers are counted; with
        ``votes`` other than 'everyone' only p's voters vote (``VPeer.voters``). One ``round.Views`` is kept
        per round while the round's core, the last round's senders, the voters and the sight's reading stay
        the same, and brought up to date with the records that moved and the announcers that came since."""
        records = self._sight(p)[1]
        c, seen = p.cores.get(r), p.announcers_of.get(r)
        key = (p.sight_epoch, c, seen, p.senders, p.voters)
        moves, first = len(p.moves), len(c.first_seen) if c else 0
        n_seen = len(seen) if seen else 0
        got = p.views.get(r)
        if got is not None and all(a is b or type(a) is int and a == b for a, b in zip(got[0], key)):
            _, views, at, was_first, was_seen = got
            if at < moves:
                views.moved(records, p.moves[at:])
            if was_first != first or was_seen != n_seen:
                views.announced(records, self._announced(p, r))
        else:
            views = core.Views(records, p.id, r, announced=self._announced(p, r), workers=p.senders,
                               voters=p.voters or ())
        p.views[r] = (key, views, moves, first, n_seen)
        return views.view()


def keeps_newest(q: VPeer, key: Any, sent: float) -> bool:
    """The DHT keeps a key's newest value: whether what was written at ``sent`` under ``key`` (a writer's member
    record: its id; its weight report of a round: (id, round)) is newer than what q holds (then noted as held).
    A late copy of an older record changes nothing."""
    if q.stamps.get(key, -1.0) < sent:
        q.stamps[key] = sent
        return True
    return False


def _everyone(q: str) -> bool:
    return True

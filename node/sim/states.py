"""State sync in the virtual simulator (node/sim/virtual.py): a re-sync adopts the newest state a peer offers
that the peer core's ``Resync`` allows, after a download time. ``States`` is a part of ``virtual.Simulation``.

A peer knows a donor by its record only. One whose process died or whose link is cut costs a stream's open
timeout (``OPEN_S``), and with no donor of the newest state in reach the download retries until it gives up;
the peer then reads the offers again until its look ends.

A peer refuses an offer claiming a round more than ``sync.RECORD_LAG`` past every other voting trainer's record
(protocol/sync.py ``beyond_reach``), and adopts only a state more than half of the winners' tails list
(``chain.adoptable``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gradnode.node.sim.vpeer import TAIL, VPeer
from gradnode.protocol import chain
from gradnode.protocol import peer as peer_core
from gradnode.protocol import sync as sync_rules

OFFER_POLL_S = 0.5  # how often a peer looking for a state offer reads the offers again (statesync.fetch)
OPEN_S = 5.0  # a stream to a donor whose process died or whose link is cut fails after this (transport._OPEN_S)


class Offer(NamedTuple):
    """A state offer as protocol/sync.py reads it: who offers the state after which round, its hash; and the
    state itself (tail, hashes, applied sets, contributors ledger)."""

    peer: str
    round: int
    param_hash: str
    state: Any


class States:
    """Looking for a state offer, and adopting one."""
    def _newest_offer(self, p: VPeer, links: set[chain.Link] | None, after: int = -2) -> tuple[Any, int]:
        """The newest state offered in p's sight past round ``after`` that the node's rule trusts (protocol/sync.py
        ``trusted_offers``: its newest link in ``links``, the winning chain's; None: the chain the other voting
        trainers follow now, as statesync.newest_offers reads it, p's own vote left out; no links at all: the hash
        most offerers give, the simulator keeps no weight-report majority for that fallback), and how many of that
        state's donors p cannot reach. p knows a donor by its record only: one whose process died or whose link is
        cut (a split, a clog) is asked like any other (``_download_s``); with none in reach the download fails:
        (None, their count), and the node reads the same offers again until their records expire or a newer state
        is offered (an older one is not taken instead). (None, 0) when nothing is offered. The state is the lowest
        reachable id's (every donor of one round on one chain offers the same state)."""
        if links is None:
            links = chain.adoptable(self._tails(p, with_me=False))
        offers = [Offer(q, t[-1][0] + 1, t[-1][1], offer) for q, (seen, t, offer, _) in p.records.items()
                  if q != p.id and t and offer is not None and self._fresh(p, q, seen) and t[-1][0] > after]
        # none claiming a round more than RECORD_LAG past every other voting trainer's record (statesync.beyond_reach:
        # the records' rounds of the voters in sight that published a tail; an offer's hash only matches itself)
        votes = self._votes(p)
        reported = {q: r for q, (r, _) in self._sight(p)[1].items() if r > 0 and votes(q)}
        offers = [o for o in offers if not sync_rules.beyond_reach(o, reported)]
        good = sync_rules.trusted_offers(offers, links=links, expected=lambda r: None)
        reach = [o for o in good if self.peers[o.peer].alive and self._linked(p, self.peers[o.peer])]
        return (min(reach, key=lambda o: o.peer).state if reach else None), len(good) - len(reach)

    def _resync(self, p: VPeer, r: int, want: peer_core.Resync) -> None:
        """Carry out the peer core's ``Resync``: adopt the newest state offered in p's sight (``_newest_offer``) of
        ``want.lowest_round`` on, of the chain its links name (a fork) or else the one the others follow (read
        again at each look). None: p's main loop looks for one for ``want.look_s``, then carries on with its
        own state."""
        links = set(want.links) if want.links is not None else None
        after = want.lowest_round - 2  # an offer's round is its newest link's plus one
        offer, dead = self._newest_offer(p, links, after)
        if offer is None:
            self.no_offer += 1
            until = self.now + want.look_s
            p.busy_until = max(p.busy_until, until)
            again = self.now + look_again_s(dead, want.look_s)
            self.at(again, lambda gen=p.gen: self._look_for_offer(p, r, links, after, until, want.look_s, gen))
            return
        self._adopt(p, r, offer, download_s(dead, want.look_s))

    def _look_for_offer(self, p: VPeer, r: int, links: set[chain.Link] | None, after: int, until: float,
                        look_s: float, gen: int) -> None:
        """p's main loop reads the offers again every OFFER_POLL_S until its look ends (statesync.fetch): one
        that turns up in reach (a link unclogged, a split healed) is adopted then. A fork's look trusts the chain
        it set out for (``links``); a hash mismatch's (None) the chain the others follow now (the node's fetch reads
        it afresh at each read, statesync.newest_offers: the winners of the look's start move on meanwhile)."""
        if gen != p.gen or not p.alive:
            return
        offer, dead = self._newest_offer(p, links, after)
        if offer is not None:
            self._adopt(p, r, offer, download_s(dead, look_s))
        elif self.now + look_again_s(dead, look_s) < until:
            self.at(self.now + look_again_s(dead, look_s),
                    lambda: self._look_for_offer(p, r, links, after, until, look_s, gen))

    def _adopt(self, p: VPeer, r: int, offer: Any, lost: float = 0.0) -> None:
        """p downloads ``offer`` (``lost`` seconds to donors out of reach first) and runs on from it (its rounds
        after the offer's are computed again)."""
        tail, hashes, applied, ledger, p.reputation, pools = offer
        newest = tail[-1][0]
        self.made_up += tail[-1] in self.fakes and not p.lie
        p.resyncs += 1
        self.far_states += newest >= self.sc.rounds and not p.lie
        self.repairs.append(newest - r)
        self.adopted.append(newest)
        self.per_round[r]["resyncs"] += 1
        p.gen += 1
        was_done, p.done = p.done, False
        p.busy_until = self.now + lost + self._transfer_s(None, p.id, self.sc.state_bytes)
        p.traffic.state_bytes_down += self.sc.state_bytes
        p.hashes = {k: h for k, h in hashes.items() if k <= newest}
        p.applied = {k: f for k, f in applied.items() if k <= newest}
        p.ledger, p.senders, p.pools = dict(ledger), frozenset(), {k: v for k, v in pools.items() if k <= newest}
        self._revote(p)
        p.waiting, p.computed = None, -1
        p.core.step(peer_core.StateAdopted(self.now, newest))
        # what it holds now, it says (the node's member record publishes its chain's tail, and a report of a
        # chain left since counts for the one followed now: chores.off_majority)
        self._publish_record(p, tuple((k, p.hashes[k]) for k in range(max(0, newest - TAIL + 1), newest + 1)
                                      if k in p.hashes))  # a liar's far state skips the rounds before it
        self.at(p.busy_until, lambda: self._compute(p, newest + 1))
        if was_done:  # its heartbeat had stopped at the end of its run
            self.at(self.now + self.heartbeat_s, lambda: self._heartbeat(p))


def give_up_s(look_s: float) -> float:
    """How long one state download of a look of ``look_s`` seconds retries its donors before it gives up
    (statesync.fetch: ``max(10, look_s / 2)``, within the look)."""
    return min(look_s, max(10.0, look_s / 2))


def download_s(dead: int, look_s: float) -> float:
    """What ``dead`` donors out of reach add to a state download that a reachable one serves: a chunk asks the
    donors in a random order (transport.fetch_async) and one that cannot answer fails after a stream's open
    timeout (OPEN_S), so the slowest of a state's many chunks tries about every one of them first."""
    return min(OPEN_S * dead, give_up_s(look_s))


def look_again_s(dead: int, look_s: float) -> float:
    """When a peer looking for a state offer reads the offers again: OFFER_POLL_S after it found none (the node
    sleeps 0.5 s), or a second after a download that retried donors out of reach (``dead`` of them) until it gave
    up (statesync.fetch)."""
    return give_up_s(look_s) + 1.0 if dead else OFFER_POLL_S

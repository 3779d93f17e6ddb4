"""Whose votes count: the keys whose weight reports and published chains a peer counts (the chain rule,
protocol/chain.py; the hash check's majority; who holds a round open, round.view_of).

Keys cost nothing, so a vote must rest on work: a key counts when

    its updates counted in a round this peer's chain applied in the last CONTRIBUTOR_ROUNDS (the shared
    contributors ledger, Engine.contributors), or this peer itself verified an update of it (signed for the
    run and the round, within the rules) for one of those rounds, on any chain,

and it is not banned (by the shared reputation table, or caught equivocating). Before a peer applied any
round (an empty ledger) every key counts, as before: a fresh peer has nobody's work to go by.

Why not the ledger alone: a ledger is one chain's, and a peer that forked alone in round 0 counts only its
own chain's contributors (itself and whoever was in its set). Its own chain then ties or wins against the
chain everyone else follows, whose keys its ledger never names, and the run ends on two hashes (the
deterministic simulator: seed 15 of a healed 2|2 split with late records; node/SWARM.md). The updates it
verified name the peers working beside it whatever chain they follow; a key that never sends an update
(the 'sybilvotes' attacker's) is in neither. What a key must do for a vote is no cheaper than before: the
ledger took any update a majority of the witnesses verified and the robust rule kept, which a small update
is; a verified update now, on one peer's word, which weighs what it costs (an upload a round) and gives
no more than the ledger gave a key that sent to one side of a split only. Why the bans: an attacker's updates count for a round or two
before the robust rule screens it out or its equivocation is proven, and the ledger remembers them for 64
rounds; with its vote it could tie a chain it follows with the honest peers' (the mix of adversaries: four
honest peers, three attackers in the ledger).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

CONTRIBUTOR_ROUNDS = 64  # the ledger's memory (train/engine.py) and the verified updates' here


def voters(ledger: Mapping[str, int], verified: Mapping[str, int], round_: int,
           banned: Collection[str] = ()) -> frozenset[str]:
    """The keys whose votes count for a peer whose newest applied round is ``round_``: the ledger's (sender ->
    last round its update counted) and the senders of the updates it verified (sender -> newest round) within
    the last CONTRIBUTOR_ROUNDS, less ``banned`` (the ledger's keys all the same when every key is banned: an
    empty set means everyone). Empty only while the ledger is."""
    if not ledger:
        return frozenset()
    recent = round_ - CONTRIBUTOR_ROUNDS
    keys = frozenset(ledger).union(p for p, r in verified.items() if r > recent)
    return keys.difference(banned) or frozenset(ledger)

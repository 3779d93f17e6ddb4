"""Whose votes count: the keys whose weight reports and published chains a peer counts (the chain rule,
protocol/chain.py; the hash check's majority; who holds a round open, round.view_of).

Keys cost nothing, so a vote must rest on work: a key counts when

    its updates counted in a round this peer's chain applied in the last CONTRIBUTOR_ROUNDS (the shared
    contributors ledger, Engine.contributors), or this peer verified an update of it for one of those rounds
    outside the set it applied (another chain's round, a late update) that the robust rule counts among all
    the updates it verified for that round (Peer._note_workers, Engine.kept),

and it is not banned (by the shared reputation table, or caught equivocating). Before a peer applied any
round (an empty ledger) every key counts, as before: a fresh peer has nobody's work to go by.

Why not the ledger alone: a ledger is one chain's, and a peer that forked alone in round 0 counts only its
own chain's contributors (itself and whoever was in its set). Its own chain then ties or wins against the
chain everyone else follows, whose keys its ledger never names, and the run ends on two hashes (the
deterministic simulator: seed 15 of a healed 2|2 split with late records; docs/notes/swarm.md). The updates it
verified name the peers working beside it whatever chain they follow. The bar is the ledger's: an update
the robust rule would count (not a replay, not against the others' direction); a rules-valid update it
screens out (a replay, a flipped sign, noise) earns no vote, though the reputation table never strikes a
newcomer; a key that never sends an update (the 'sybilvotes' attacker's) has none. The screens judge an
update against the others, so this bar holds while honest updates are most of what a peer verified: keys
sending junk in a majority pass them (a set they were in would count them too, and that is the robust
rule's own bound: the model is lost to them whether they vote or not), and by sending it late, outside every
set, they vote without moving the model, which the ledger alone did not allow. What else differs: the
ledger is the same on every peer of a chain, these senders are one peer's own sight, so a key that sends
its update to some peers only is counted by those only (as a key that contributed on one side of a split
only is counted by that side's ledger). Why the bans: an attacker's updates count for a round or two
before the robust rule screens it out or its equivocation is proven, and the ledger remembers them for 64
rounds. (When every key a peer knows is banned, its ledger's keys count, banned or not.)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

CONTRIBUTOR_ROUNDS = 64  # the ledger's memory (train/engine.py) and the verified updates' here


def voters(ledger: Mapping[str, int], verified: Mapping[str, int], round_: int,
           banned: Collection[str] = ()) -> frozenset[str]:
    """The keys whose votes count for a peer whose newest applied round is ``round_``: the ledger's (sender ->
    last round its update counted) and ``verified``'s (sender -> newest round of an update of it this peer
    verified and the screens kept, outside its sets) within the last CONTRIBUTOR_ROUNDS, less ``banned`` (the
    ledger's keys all the same when every key is banned: an empty set means everyone). Empty only while the
    ledger is."""
    if not ledger:
        return frozenset()
    recent = round_ - CONTRIBUTOR_ROUNDS
    keys = frozenset(ledger).union(p for p, r in verified.items() if r > recent)
    return keys.difference(banned) or frozenset(ledger)


def workers_after(workers: Mapping[str, int], round_: int, verified: Collection[str], me: str,
                  decided: Collection[str], ledger: Collection[str],
                  kept: Callable[[], Collection[str]]) -> dict[str, int]:
    """The senders a peer verified working beside it (``voters``' ``verified``) once it verified round
    ``round_``'s updates of ``verified``: those outside the set it applies (``decided``), the ledger and itself
    that the screens count among all it verified (``kept``, run only when there are such senders: screens cost
    about what an apply does) join as of this round; those older than CONTRIBUTOR_ROUNDS are forgotten. A new
    dict: other threads read the old one."""
    extra = [s for s in verified if s != me and s not in decided and s not in ledger]
    if not extra:
        return dict(workers)
    counted = kept()
    out = {s: r for s, r in workers.items() if r > round_ - CONTRIBUTOR_ROUNDS}
    out.update((s, round_) for s in extra if s in counted)
    return out

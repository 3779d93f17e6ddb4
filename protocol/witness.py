"""A round's set of updates, decided by witnesses: the pure rule (reports in, a set out).

Every eligible peer (a recent contributor; the node's ledger says who) is a *witness*: at its deadline
it publishes a signed report of the updates it fetched and verified, as fingerprints (records.Report).
The round's set is

    every update listed by a strict majority of the witness reports counted,

so no minority of witnesses can keep an update out that the others verified (censorship), nor put one
in that the others did not (a leader, under the rule before, chose the set alone), and one report more
or less moves only an update whose count sits exactly at the threshold: when everyone verified
everything, any majority of the reports gives the same set.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable

from gradnode.protocol.records import unpack


def quorum(reports: int) -> int:
    """Reports that must list an update for it to be in the round: a strict majority of them."""
    return reports // 2 + 1


def witnessed(reports: Iterable[bytes]) -> bytes:
    """The fingerprints (sorted, concatenated) listed by a strict majority of ``reports`` (each one report's
    packed fingerprints; a report listing one twice counts once)."""
    # identical reports counted together, times their copies (honest witnesses mostly saw the same updates);
    # the same reports counted again (every peer of a round counts them, at every poll) are counted once
    return _count(frozenset(Counter(reports).items()))


@functools.lru_cache(maxsize=256)
def _count(copies: frozenset[tuple[bytes, int]]) -> bytes:
    counts: Counter[bytes] = Counter()
    for fps, n in copies:
        for fp in set(unpack(fps)):
            counts[fp] += n
    need = quorum(sum(n for _, n in copies))
    return b"".join(sorted(fp for fp, n in counts.items() if n >= need))


WITNESS_WINDOW = 8  # rounds: a peer whose update was applied this recently witnesses the next round


def eligible_witnesses(contributors: dict[str, int], round_: int) -> list[str]:
    """The eligible witnesses of ``round_``: the peers whose updates rounds ``round_ - WITNESS_WINDOW`` to
    ``round_ - 1`` applied, by the contributors ledger (Engine.contributors). Not the previous round's senders
    alone: a witness left out of one round (late, or its update censored) still counts in the next."""
    return sorted(p for p, r in contributors.items() if round_ - WITNESS_WINDOW <= r < round_)

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

from collections import Counter
from collections.abc import Iterable

from gradnode.protocol.records import unpack


def quorum(reports: int) -> int:
    """Reports that must list an update for it to be in the round: a strict majority of them."""
    return reports // 2 + 1


def witnessed(reports: Iterable[bytes], need: int | None = None) -> bytes:
    """The fingerprints (sorted, concatenated) listed by a strict majority of ``reports`` (each one report's
    packed fingerprints; a report listing one twice counts once), or by ``need`` of them when given (a drawn
    committee's strict majority of its witnesses, however many reports are counted)."""
    reports = list(reports)
    counts: Counter[bytes] = Counter()
    # identical reports counted together, each fingerprint once per distinct report with its copies added
    # (honest witnesses mostly saw the same updates: 512 identical reports of 512 updates are 512 additions,
    # not 262,144); a report seen once, the common case of a swarm's late records, is counted in C
    for fps, copies in Counter(reports).items():
        if copies == 1:
            counts.update(set(unpack(fps)))
        else:
            for fp in set(unpack(fps)):
                counts[fp] += copies
    return _majority(counts, quorum(len(reports)) if need is None else need)


def _majority(counts: Counter[bytes], need: int) -> bytes:
    """The fingerprints ``counts`` finds in ``need`` reports or more, sorted and concatenated."""
    return b"".join(sorted(fp for fp, n in counts.items() if n >= need))


class Counts:
    """``witnessed`` for a caller that counts many multisets of nearly the same reports (every peer of a round
    counts the round's reports as they reached it: at 512 peers, 512 counts of ~512 reports of ~512
    fingerprints, 134 million additions a round counted anew). Each count is derived from the nearest of the
    last few made: their counts, plus the reports added, less those gone. The same bytes as ``witnessed``."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._made: list[tuple[Counter[bytes], Counter[bytes]]] = []  # (reports, fingerprint counts), newest last

    def __call__(self, reports: Iterable[bytes], need: int | None = None) -> bytes:
        have = Counter(reports)
        base: tuple[Counter[bytes], Counter[bytes]] | None = None
        changed = set(have)  # the reports whose copies differ from the base's (all of them from nothing)
        for made in self._made:  # the base whose reports differ least from these
            differ = {fps for fps, _ in have.items() ^ made[0].items()}  # in C: few when they are alike
            if len(differ) < len(changed):
                base, changed = made, differ
        counts = Counter() if base is None else base[1].copy()
        before = Counter() if base is None else base[0]
        for fps in changed:
            copies = have[fps] - before[fps]
            for fp in set(unpack(fps)):
                n = counts[fp] + copies  # never 0 for a fingerprint not counted yet: copies is not 0
                if n:
                    counts[fp] = n
                else:  # gone with the reports that listed it (kept, the counts would grow with every one)
                    del counts[fp]
        self._made = ([m for m in self._made if m is not base] + [(have, counts)])[-self.keep:]
        total = sum(have.values())
        return _majority(counts, quorum(total) if need is None else need)


WITNESS_WINDOW = 8  # rounds: a peer whose update was applied this recently witnesses the next round


def eligible_witnesses(contributors: dict[str, int], round_: int) -> list[str]:
    """The eligible witnesses of ``round_``: the peers whose updates rounds ``round_ - WITNESS_WINDOW`` to
    ``round_ - 1`` applied, by the contributors ledger (Engine.contributors). Not the previous round's senders
    alone: a witness left out of one round (late, or its update censored) still counts in the next."""
    return sorted(p for p, r in contributors.items() if round_ - WITNESS_WINDOW <= r < round_)

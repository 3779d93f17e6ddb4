"""Getting level with the swarm, as every peer decides it: which state offers to trust, in what order to
download them, whether to replay the missed rounds or download the state, and what a weight-hash check
calls for.

Pure, like the round's core (round.py): the shell (node/swarm/sync.py, statesync.py, peer.py) reads the
offers, records and reports and does the downloads; the virtual simulator (node/sim/virtual.py) calls the
same functions on what its peers see.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from typing import Callable, Collection, Iterable, Mapping, Protocol, Sequence, TypeVar


FUTURE_S = 60.0  # a 'finished' record dated further ahead of the reader's clock counts for nothing (run_over; clocks
# of one DHT agree within 3 s: protocol/skew.py)
RECORD_LAG = 10  # rounds a member record may lag its peer (after the round's chores; more on a loaded machine)


class Offer(Protocol):
    """A state offer as these rules read it (records.StateManifest): who offers the state after which round
    (an offer of round R holds the state after applying round R - 1), its hash and its chunks."""

    peer: str
    round: int
    param_hash: str


class Chunked(Offer, Protocol):
    """An offer with the digests of its state's chunks (records.StateManifest)."""

    chunks: Sequence[str]


O = TypeVar("O", bound=Offer)
C = TypeVar("C", bound=Chunked)
V = TypeVar("V")


def beyond_reach(offer: Offer, reported: Mapping[str, int]) -> bool:
    """The offer claims a round more than RECORD_LAG past the highest round any *other* voting trainer
    reports (``reported``: peer -> its record's round; neither the offerer nor the reader). An offer's hash
    only has to match itself, so one key could claim a state far ahead; no key can vouch for its own offer.
    With no other member reporting, nothing is beyond reach."""
    others = [r for p, r in reported.items() if p != offer.peer]
    return bool(others) and offer.round > max(others) + RECORD_LAG


def trusted_offers(offers: Sequence[O], *, links: Collection[tuple[int, str]] | None,
                   expected: Callable[[int], str | None]) -> list[O]:
    """The offers of the newest round on the chain the swarm follows: a state whose (round - 1, hash) is in
    ``links`` (chain.adoptable: the states most of the winning chain lists; an empty set trusts nothing: the tails
    in sight vouch for no state yet); without any published chain (None), the hash the majority reported after
    the previous round (``expected(round)``, asked only for the rounds looked at, newest first; None: nobody
    reported), or else the one most offerers give, at least two (a tie: the greatest hash; one key's offer alone
    is its own word: a peer whose ledger's keys are all gone counts no tail and no report, and took any key's
    made-up state). Empty when no round has such an offer."""
    for round_ in sorted({o.round for o in offers}, reverse=True):
        here = [o for o in offers if o.round == round_]
        if links is not None:
            good = [o for o in here if (round_ - 1, o.param_hash) in links]
        else:
            want = expected(round_)
            if want is None:
                votes = Counter(h for _, h in {(o.peer, o.param_hash) for o in here})
                want = max(((n, h) for h, n in votes.items() if n >= 2), default=(0, None))[1]
            good = [o for o in here if o.param_hash == want]
        if good:
            return good
    return []


def download_order(offers: Sequence[C]) -> list[list[C]]:
    """Offers that list the same chunks form a group, each chunk fetched from any member; the largest group
    first, ties to the lowest peer id."""
    groups: dict[tuple[str, ...], list[C]] = {}
    for o in offers:
        groups.setdefault(tuple(o.chunks), []).append(o)
    return sorted(groups.values(), key=lambda g: (-len(g), min(o.peer for o in g)))


class CatchUp(enum.Enum):
    """How a peer behind gets level: replay the missed rounds' updates, or download the state."""

    REPLAY = "replay"
    DOWNLOAD = "download"


def replay_or_download(*, behind: int, window: int, replay_bytes: int, state_bytes: int) -> CatchUp:
    """A peer ``behind`` rounds behind the newest offer, whose missed rounds' updates are kept for ``window``
    rounds and weigh ``replay_bytes`` against a state of ``state_bytes``: replay them when that is cheaper and
    they are all kept, else download the state."""
    if behind <= 0 or behind > window or replay_bytes >= state_bytes:
        return CatchUp.DOWNLOAD
    return CatchUp.REPLAY


def lowest_round(own_round: int, *, resync: bool, fork: bool) -> int:
    """The oldest state a look may take (an offer's round: the state after applying the round before it), for a
    peer whose engine is at ``own_round``: a lost fork's, any state of the winning chain (its links decide); a
    re-sync after a hash mismatch's, a state of its own round on (an older one would have it redo rounds it may
    split again: docs/notes/swarm.md measures the other choice); a start's or a resume's, a newer state only."""
    return 0 if fork else own_round if resync else own_round + 1


def newer_in_sight(own_round: int, record_rounds: Iterable[int]) -> bool:
    """Whether a peer starting or resuming at ``own_round`` may find a newer state to adopt: a member record in
    sight (``record_rounds``: the other training peers') names a later round. When none does, the shell reads
    the offers once (a record lags its peer) instead of looking for seconds: a fresh run's peers all start at
    round 0, and each paid the whole look at every start."""
    return any(r > own_round for r in record_rounds)


def mismatch_counts(mismatch: int | None, trusted_from: int) -> bool:
    """A round's hash off the majority's counts only on a round this peer's weights still descend from
    (``trusted_from``: the first round held since its last re-sync; one before it was checked on weights
    replaced since: nothing to repair)."""
    return mismatch is not None and mismatch >= trusted_from


def asks_if_over(trainers: Collection[int], enough: bool, resumed: bool, target: int) -> bool:
    """Whether a waiting peer asks if the run is over (``run_over``), given the rounds of the trainers it sees:
    when it sees none (the others may have finished), or when it just resumed its checkpoint and sees enough
    trainers to go on with, all short of the last round ``target`` (others back after the run's end, like
    itself: two such peers saw each other train and trained on to the end on a chain of their own). Not a peer
    between rounds (a DHT read a round, and a majority of its ledger's keys could stop it while it trains with
    others), nor one that sees a finisher (it goes on with them, taking the newest state offered, not stopping
    short), nor in a run with no last round (``target`` 0)."""
    return not trainers or (enough and resumed and target > 0 and all(r < target for r in trainers))


def newest_per_key(records: Iterable[tuple[str, float, V]], now: float, *,
                   oldest: float = -math.inf) -> dict[str, tuple[float, V]]:
    """Each key's newest of ``records`` (key, the time it is dated, what it says): {key: (time, what)}, none dated
    before ``oldest`` nor more than ``FUTURE_S`` after ``now`` (one dated ahead counts for nothing, and hides no
    other); of two dated alike, the greater. The same whatever the order the records come in."""
    out: dict[str, tuple[float, V]] = {}
    for key, t, value in records:
        if oldest <= t <= now + FUTURE_S and (key not in out or (t, value) > out[key]):
            out[key] = (t, value)
    return out


def kept_finished(kept: Iterable[tuple[str, float, bytes]], seen: Iterable[tuple[str, float, bytes]], now: float,
                  ttl: float, cap: int) -> list[bytes]:
    """Which verified 'finished' records (author, the time it is dated, its bytes) a bootstrap keeps and serves
    (node/swarm/finished.py): of those it ``kept`` and those it has ``seen`` since, each author's newest, none dated
    more than ``ttl`` before ``now`` (the DHT would have dropped it) or more than ``FUTURE_S`` after it
    (``run_over`` ignores it), at most ``cap``. An author kept keeps its place: newcomers take the room left, the
    earliest dated first (on its clock: a flood of keys re-dating its records cannot push the finishers out once
    they are kept; one that comes before them can crowd the cap, and a returning peer then waits, as without a
    keeper)."""
    old, new = newest_per_key(kept, now, oldest=now - ttl), newest_per_key(seen, now, oldest=now - ttl)
    kept_now = {p: max(v, new[p]) if p in new else v for p, v in old.items()}
    room = max(0, cap - len(kept_now))
    for p in sorted((p for p in new if p not in kept_now), key=lambda p: (min(new[p][0], now), p))[:room]:
        kept_now[p] = new[p]
    if len(kept_now) > cap:  # a smaller cap than the one that kept them: the earliest dated stay
        kept_now = dict(sorted(kept_now.items(), key=lambda kv: (kv[1][0], kv[0]))[:cap])
    return [raw for _, (_, raw) in sorted(kept_now.items())]


def run_over(finished: Mapping[str, tuple[int, str, float]], ledger: Collection[str], me: str, target: int, *,
             since: float = -math.inf, now: float = math.inf, banned: Collection[str] = ()) -> tuple[int, str] | None:
    """Whether the run is over for a waiting peer: more than half the keys of its ledger other than itself and
    ``banned`` (the contributors its chain knows: work behind each; not those the reputation table or a proof of
    equivocation banned, nor revoked ones) say they reached the run's last round ``target`` (``finished``: key ->
    the round it reached, its weight hash, the time it said so), at ``since`` or later (the time of the state
    this peer holds: an earlier record belongs to an earlier run under the same run id and keys) and no later
    than ``now`` + ``FUTURE_S`` (a record dated ahead would pass ``since`` in every later run). Then the (round,
    hash) most of them name (a tie to the lower round, then the lower hash: a liar's far round wins no tie); else
    None. A fresh peer (no ledger) believes nobody, and a minority of its
    contributors cannot end the run for it (one that lies, or a side of a split); with one other key in its
    ledger (a run of two), that key is the majority."""
    others = set(ledger) - {me} - set(banned)
    done = [(r, h) for p, (r, h, t) in finished.items()
            if p in others and r >= target and since <= t <= now + FUTURE_S]
    if not others or 2 * len(done) <= len(others):
        return None
    counts = Counter(done)
    return min(counts, key=lambda v: (-counts[v], v[0], v[1]))

"""The round exchange's fetches (node/swarm/exchange.py), on a fake transport and member list: what it fetches,
and how many at once."""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
from types import SimpleNamespace
from typing import Any

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.exchange import Rejections, RoundExchange
from gradnode.node.swarm.transport import BlobStore
from gradnode.protocol import round as core
from gradnode.protocol.records import UpdateAnnouncement, update_name

ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
RUN = "run"


def peer_id(i: int) -> str:
    return "Qm" + "".join(ALPHABET[(i // len(ALPHABET) ** k) % len(ALPHABET)] for k in range(20))


class FakeTransport:
    """Fetches that end when the test says so; counts how many are in flight."""

    def __init__(self) -> None:
        self.peer_id = peer_id(0)
        self.blobs = BlobStore(64)  # far less than the round's updates: they are the round's work, held anyway
        self.futures: list[tuple[str, concurrent.futures.Future]] = []
        self.most_in_flight = 0

    def in_flight(self) -> list[tuple[str, concurrent.futures.Future]]:
        return [(n, f) for n, f in self.futures if not f.done()]

    def fetch_async(self, sources: Any, name: str, **kw: Any) -> str:
        return name

    def submit(self, name: str) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.futures.append((name, fut))
        self.most_in_flight = max(self.most_in_flight, len(self.in_flight()))
        return fut

    def now(self) -> float:
        return 0.0


class FakeMembers:
    def __init__(self, announcements: list[UpdateAnnouncement]) -> None:
        self.announcements = announcements
        self.transport = None

    def read(self, table: str, round_: int | None, cls: type) -> list:
        return list(self.announcements) if table == "updates" else []

    def write(self, *args: Any, **kw: Any) -> bool:
        return True

    def members(self, *args: Any, **kw: Any) -> dict:
        return {}

    def roster(self, me: str) -> int:
        return 1

    def public_key(self, peer: str) -> None:
        return None

    def sources(self, peers: list[str]) -> list[tuple[str, list[str]]]:
        return [(p, []) for p in peers]


class PassAll:
    """Rules that take every blob as a verified update of norm 1."""

    def check(self, blob: bytes, **kw: Any) -> tuple[Any, None]:
        return SimpleNamespace(norm=1.0), None

    def weight(self, update: Any) -> float:
        return 1.0


def test_fetches_in_flight_stay_within_the_bound_and_all_complete() -> None:
    """With 40 updates announced at once and swarm.max_fetches=4, at most 4 are fetched at a time, the others
    wait their turn (counted by the round's core as under way), and every one is fetched, verified and held to
    serve on, in a blob store whose bound they pass."""
    blobs = {peer_id(i): f"update {i}".encode() for i in range(1, 41)}
    anns = [UpdateAnnouncement(run_id=RUN, round=5, sender=s, digest=hashlib.sha256(b).hexdigest(), size=len(b),
                               tokens=1, time=0.0) for s, b in blobs.items()]
    transport = FakeTransport()
    ex = RoundExchange(transport=transport, membership=FakeMembers(anns), cfg=SwarmConfig(max_fetches=4),
                       run_id=RUN, round_=5, blob=None, tokens=0, round_seconds=1.0, rules=PassAll(),
                       rejections=Rejections(), stop=threading.Event(), base="00" * 32)
    events = ex._tick()
    assert len(transport.in_flight()) == 4
    assert {e.sender for e in events if isinstance(e, core.FetchStarted)} == set(blobs)
    while transport.in_flight():
        name, fut = transport.in_flight()[0]
        fut.set_result(blobs[name.rsplit("/", 1)[-1]])
        ex._tick()
    assert transport.most_in_flight == 4
    assert set(ex.verified) == set(blobs) and len(transport.futures) == 40
    assert all(transport.blobs.get(update_name(RUN, 5, s)) == b for s, b in blobs.items())  # served on, all


def _fetched_under(drawn: Any, base: str, senders: list[str], witness: bool = True) -> set[str]:
    anns = [UpdateAnnouncement(run_id=RUN, round=5, sender=s, digest=hashlib.sha256(s.encode()).hexdigest(),
                               size=10, tokens=1, time=0.0) for s in senders]
    transport = FakeTransport()
    ex = RoundExchange(transport=transport, membership=FakeMembers(anns), cfg=SwarmConfig(max_fetches=64),
                       run_id=RUN, round_=5, blob=None, tokens=0, round_seconds=1.0, rules=PassAll(),
                       rejections=Rejections(), stop=threading.Event(), base=base, committee=drawn, witness=witness)
    ex._tick()
    return {name.rsplit("/", 1)[-1] for name, _ in transport.futures}


def test_with_a_committee_it_fetches_the_drawn_and_the_admitted_newcomers_only() -> None:
    """A peer's downloads are the round's budget, not N: of 30 pool keys announcing, it fetches the 4
    drawn contributors' updates only. At a witness a newcomer is fetched when its ticket ranks among the 2
    lowest seen so far, a read's newcomers ranked best first: in one read, in any order, exactly the 2
    admitted (when each was ranked as it came, every newcomer of a read in falling ticket order was fetched).
    A peer that does not witness the round fetches no newcomer before the count (it fetches those the set
    lists after)."""
    from gradnode.protocol import committee as cm

    pool, newcomers = [peer_id(i) for i in range(1, 31)], [peer_id(i) for i in range(31, 37)]
    drawn, base = cm.draw(cm.Budget(4, 8, 2), 5, "ab" * 32, pool), "00" * 32
    admitted = cm.admitted(drawn, base, [*pool, *newcomers])
    best_first = sorted(newcomers, key=lambda k: cm.ticket(cm.Role.NEWCOMER, cm.seed(base, 5), k))
    assert _fetched_under(drawn, base, [*pool, *best_first]) == admitted and len(admitted) == 6
    for order in (newcomers, best_first[::-1]):
        fetched = _fetched_under(drawn, base, [*order, *pool])
        assert fetched == admitted
        assert _fetched_under(drawn, base, [*order, *pool], witness=False) == drawn.contributors


def test_a_fetch_asks_its_sender_first_and_reads_the_holdings_only_when_that_failed() -> None:
    """A fetch's sources are read again at every pass. The first pass asks the sender alone: a read of the
    holdings returns every holder's record, and a fetch the sender serves (the common case) needs none. With a
    read per pass, holdings were 15% of the records an 8-peer swarm read. From the second pass on, every peer
    whose holdings list the update is a source."""
    from gradnode.protocol.records import Holdings, pack

    sender, holder = peer_id(1), peer_id(2)
    digest = hashlib.sha256(b"u").hexdigest()
    reads: list[str] = []

    class Holding(FakeMembers):
        def read(self, table: str, round_: int | None, cls: type, part: int | None = None) -> list:
            reads.append(table)
            assert part is None  # a swarm of one: one holdings key
            if table != "holdings":
                return []
            return [Holdings.model_construct(peer=holder, held=pack([(sender, digest)]))]

    ex = RoundExchange(transport=FakeTransport(), membership=Holding([]), cfg=SwarmConfig(), run_id=RUN, round_=5,
                       blob=None, tokens=0, round_seconds=1.0, rules=PassAll(), rejections=Rejections(),
                       stop=threading.Event(), base="00" * 32)
    sources = ex._holders(sender, digest)
    assert sources() == [(sender, [])] and "holdings" not in reads
    assert sorted(sources()) == sorted([(sender, []), (holder, [])]) and reads.count("holdings") == 1


def test_a_fetch_looks_its_sources_addresses_up_in_a_member_list_seconds_old() -> None:
    """Every pass of every fetch looks its sources' addresses up (Membership.sources). Addresses change rarely:
    a list up to ADDRESS_AGE_S old serves, where the polls' views want one under half a second. At 0.5 s the
    fetches made 38% of an 8-peer swarm's member-list reads."""
    import time

    from gradnode.node.swarm import membership as ms

    gets: list[str] = []
    transport = SimpleNamespace(now=lambda: 0.0, blocked=set(), get=lambda key, fresh=False: gets.append(key) or [])
    m = ms.Membership(transport, SimpleNamespace(peer_id=peer_id(0), public_der=b"k"), RUN, ttl=30.0)
    m.members()
    assert len(gets) == 1
    m._read_at = time.monotonic() - 1.0  # a list a second old: good for addresses, stale for a view
    m.sources([peer_id(1)])
    assert len(gets) == 1
    m.members()
    assert len(gets) == 2
    m._read_at = time.monotonic() - ms.ADDRESS_AGE_S - 0.1
    m.sources([peer_id(1)])
    assert len(gets) == 3

"""A bootstrap keeps the run's end (node/swarm/finished.py ``Kept``): the verified 'finished' records it reads go to
its run folder and are served as one blob, also after it restarts with an empty DHT. Real keys and a real
Membership; the DHT here is a list of (owner, record bytes), as Transport.get returns it."""

from __future__ import annotations

from pathlib import Path

from gradnode.node.swarm.finished import FILE_NAME, Kept
from gradnode.node.swarm.identity import Identity, load_or_create
from gradnode.node.swarm.membership import Membership
from gradnode.node.swarm.transport import BlobStore
from gradnode.protocol.records import Finished, kept_finished_name, kept_finished_of

RUN, TTL, NOW = "run-a", 7 * 86400.0, 1_000_000.0


class Dht:
    """What a Membership asks of its transport here: one DHT read, the clock, the blobs it serves."""

    def __init__(self, records: list[tuple[str, bytes]]) -> None:
        self.records, self.blobs, self.blocked = records, BlobStore(1 << 20), set()

    def get(self, key: str, fresh: bool = False) -> list[tuple[str, bytes]]:
        return list(self.records) if key == f"gradnode/{RUN}/finished" else []

    def now(self) -> float:
        return NOW


def finished(by: Identity, *, run: str = RUN, peer: str | None = None, t: float = NOW - 60) -> bytes:
    rec = Finished(run_id=run, peer=peer or by.peer_id, public_key=by.public_der, round=8, param_hash="ab" * 32,
                   time=t)
    return rec.signed(by.sign(rec.signing_bytes())).to_bytes()


def served(dht: Dht) -> list[bytes]:
    blob = dht.blobs.get(kept_finished_name(RUN))
    return kept_finished_of(blob) if blob is not None else []


def test_a_bootstrap_keeps_verified_finished_records_and_serves_them_again_after_a_restart(tmp_path: Path) -> None:
    me, a, b, c = (load_or_create(tmp_path / f"{n}.key") for n in "mabc")
    good = [finished(a), finished(b)]
    bad = [finished(c, peer=a.peer_id),  # a's id with c's key: the key must hash to the id
           finished(c, run="run-b"),  # another run's
           finished(c, t=NOW - TTL - 1),  # older than the DHT would keep it
           good[0][:-3] + b"xyz"]  # damaged
    dht = Dht([(a.peer_id, good[0]), (b.peer_id, good[1]), *((c.peer_id, r) for r in bad)])
    path = tmp_path / "bootstrap" / FILE_NAME
    path.parent.mkdir()

    kept = Kept(Membership(dht, me, RUN, 30.0), dht, path, TTL, every_s=0.0)  # type: ignore[arg-type]
    assert served(dht) == [] and not path.exists()
    kept.refresh()
    assert sorted(served(dht)) == sorted(good) and sorted(kept_finished_of(path.read_bytes())) == sorted(good)

    newer = finished(a, t=NOW - 10)
    dht.records = [(a.peer_id, newer)]  # the DHT lost b's record: kept all the same
    kept.refresh()
    assert sorted(served(dht)) == sorted([newer, good[1]])

    restarted = Dht([])  # a restarted bootstrap: an empty DHT, its run folder
    Kept(Membership(restarted, me, RUN, 30.0), restarted, path, TTL)  # type: ignore[arg-type]
    assert sorted(served(restarted)) == sorted([newer, good[1]])


def test_a_damaged_or_forged_file_costs_only_what_it_kept(tmp_path: Path) -> None:
    from gradnode.protocol.records import kept_blob

    me, a, c = (load_or_create(tmp_path / f"{n}.key") for n in "mac")
    path = tmp_path / FILE_NAME
    for content in (b"\x00garbage", kept_blob([finished(c, peer=a.peer_id)])):
        path.write_bytes(content)
        dht = Dht([])
        Kept(Membership(dht, me, RUN, 30.0), dht, path, TTL)  # type: ignore[arg-type]
        assert served(dht) == []
    path.write_bytes(kept_blob([finished(c, peer=a.peer_id), finished(a)]))
    dht = Dht([])
    Kept(Membership(dht, me, RUN, 30.0), dht, path, TTL)  # type: ignore[arg-type]
    assert [Finished.from_bytes(r).peer for r in served(dht)] == [a.peer_id]  # signatures are salted: by author

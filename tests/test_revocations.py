"""A bootstrap keeps the run's revocations (node/swarm/admission.py ``KeptRevocations``): the valid lists it reads go to
its run folder, and it stores the fullest in the DHT under its own key, also after it restarts with an empty DHT.
Real keys and a real Gate; the DHT here is a dict of (owner -> record bytes), as Transport.read returns it."""

from __future__ import annotations

from pathlib import Path

from gradnode.node.swarm import admission
from gradnode.node.swarm.admission import Gate, KeptRevocations
from gradnode.node.swarm.identity import Identity, load_or_create
from gradnode.protocol.records import Revocation, kept_blob, kept_revocations_of

RUN, NOW = "run-a", 1_000_000.0
KEY = f"gradnode/{RUN}/revocations"


class Dht:
    """What KeptRevocations asks of its transport: one unshared read (None: it failed), a store under its own key."""

    def __init__(self, peer_id: str, values: dict[str, bytes] | None = None) -> None:
        self.peer_id, self.values, self.stores, self.fails = peer_id, dict(values or {}), 0, False

    def read(self, key: str, timeout: float = 10.0) -> list[tuple[str, bytes]] | None:
        return None if self.fails else list(self.values.items()) if key == KEY else []

    def store(self, key: str, value: bytes, ttl: float) -> bool:
        assert key == KEY and ttl > 0
        self.values[self.peer_id] = value
        self.stores += 1
        return True

    def now(self) -> float:
        return NOW


def revoked_by(dht: Dht, authority: Identity) -> frozenset[str]:
    """What a peer started now takes from the DHT (Membership.members: every value under the key, verified)."""
    gate = Gate(RUN, authority.public_der, dht.now)
    gate.take_revocations([raw for _, raw in dht.read(KEY) or []])
    return gate.revoked


def test_a_restarted_bootstrap_stores_the_revocations_again_so_a_new_peer_reads_them(tmp_path: Path) -> None:
    auth, me, a, b, c = (load_or_create(tmp_path / f"{n}.key") for n in ("auth", "me", "a", "b", "c"))
    first = admission.revocation(auth, RUN, [a.peer_id], NOW - 60)
    junk = {c.peer_id: admission.revocation(c, RUN, [b.peer_id], NOW),  # not the authority's
            b.peer_id: admission.revocation(auth, "run-b", [b.peer_id], NOW)[:-3] + b"xyz"}  # damaged
    dht = Dht(me.peer_id, {auth.peer_id: first, **junk})
    path = tmp_path / "bootstrap" / KeptRevocations.FILE_NAME
    path.parent.mkdir()
    gate = Gate(RUN, auth.public_der, dht.now)
    kept = KeptRevocations(gate, dht, path, every_s=0.0)  # type: ignore[arg-type]
    assert kept.lists == [] and not path.exists() and dht.stores == 0
    kept.refresh()
    assert gate.revoked == {a.peer_id} and kept_revocations_of(path.read_bytes()) == [first]
    assert dht.stores == 0  # the DHT holds the authority's list

    newer = admission.revocation(auth, RUN, [a.peer_id, b.peer_id], NOW - 10)
    dht.values[auth.peer_id] = newer
    kept.refresh()
    assert kept.lists == [newer] and gate.revoked == {a.peer_id, b.peer_id} and dht.stores == 0

    del dht.values[auth.peer_id]  # the authority's copy expired: the bootstrap's goes in its place
    kept.refresh()
    assert dht.values[me.peer_id] == newer and dht.stores == 1
    kept.refresh()
    assert dht.stores == 1  # held: not stored again (until half its life is gone)

    dht.fails = True  # a failed read changes nothing
    kept.refresh()
    assert kept.lists == [newer] and dht.stores == 1

    # every DHT node restarted (the run's peers away, the bootstrap upgraded): the DHT holds no list. A peer that
    # starts now admits a and b again, unless the bootstrap, back with its run folder, stores its list again
    restarted = Dht(me.peer_id)
    assert revoked_by(restarted, auth) == frozenset()
    gate = Gate(RUN, auth.public_der, restarted.now)
    kept = KeptRevocations(gate, restarted, path, every_s=0.0)  # type: ignore[arg-type]
    assert gate.revoked == {a.peer_id, b.peer_id}  # its own streams refuse them from the start
    kept.refresh()
    assert revoked_by(restarted, auth) == {a.peer_id, b.peer_id}
    cert = admission.admit(auth, RUN, a.peer_id, NOW + 600)
    fresh = Gate(RUN, auth.public_der, restarted.now)
    fresh.take_revocations([raw for _, raw in restarted.read(KEY) or []])
    assert fresh.why_not(a.peer_id, cert) == "admission revoked"


def test_lists_that_add_peers_are_all_kept_and_a_damaged_or_forged_file_costs_only_itself(tmp_path: Path) -> None:
    auth, me, c = (load_or_create(tmp_path / f"{n}.key") for n in ("auth", "me", "c"))
    ids = [load_or_create(tmp_path / f"p{i}.key").peer_id for i in range(12)]
    path = tmp_path / KeptRevocations.FILE_NAME
    # two lists neither of which holds the other (two machines revoked with one key at once): both kept, the
    # fuller one stored; an older list that the newer holds is dropped
    one, two = (admission.revocation(auth, RUN, peers, NOW) for peers in ([ids[0], ids[1]], [ids[0], ids[2], ids[3]]))
    old = admission.revocation(auth, RUN, [ids[0]], NOW - 100)
    dht = Dht(me.peer_id, {auth.peer_id: one, c.peer_id: two, ids[5]: old})
    kept = KeptRevocations(Gate(RUN, auth.public_der, dht.now), dht, path, every_s=0.0)  # type: ignore[arg-type]
    kept.refresh()
    assert kept.lists == [one, two] and dht.stores == 0  # the DHT holds both
    assert set(Revocation.from_bytes(kept_revocations_of(path.read_bytes())[0]).revoked) == {ids[0], ids[1]}
    # the DHT lost them: one value under its key, it stores them in turn, the fullest first, and a peer reading
    # at each refresh holds every peer of both (a peer's gate adds up what it reads)
    dht.values = {}
    reader = Gate(RUN, auth.public_der, dht.now)
    for stored in (two, one, two):
        kept.refresh()
        assert dht.values == {me.peer_id: stored}
        reader.take_revocations(list(dht.values.values()))
    assert reader.revoked == {ids[0], ids[1], ids[2], ids[3]}
    # at most KEPT_REVOCATIONS_MAX lists, the fullest: of twelve lists of one peer each, those of peers 4 to 11
    # add to the two above (0 to 3 are in them already), and the newest six of them are kept beside them
    dht.values.update({f"o{i}": admission.revocation(auth, RUN, [ids[i]], NOW + i) for i in range(12)})
    kept.refresh()
    assert kept.lists[-2:] == [one, two] and len(kept.lists) == 8
    assert [Revocation.from_bytes(raw).revoked for raw in kept.lists[:6]] == [[i] for i in ids[6:]]

    for content in (b"\x00garbage", kept_blob([admission.revocation(c, RUN, [ids[0]], NOW)]),
                    kept_blob([b"x"] * 9)):
        path.write_bytes(content)
        gate = Gate(RUN, auth.public_der, dht.now)
        kept = KeptRevocations(gate, Dht(me.peer_id), path)  # type: ignore[arg-type]
        assert kept.lists == [] and gate.revoked == frozenset()
    path.write_bytes(kept_blob([admission.revocation(c, RUN, [ids[0]], NOW), one]))
    gate = Gate(RUN, auth.public_der, dht.now)
    assert KeptRevocations(gate, Dht(me.peer_id), path).lists == [one]  # type: ignore[arg-type]
    assert gate.revoked == {ids[0], ids[1]}


def test_an_open_run_keeps_nothing(tmp_path: Path) -> None:
    auth, me = load_or_create(tmp_path / "auth.key"), load_or_create(tmp_path / "me.key")
    dht = Dht(me.peer_id, {auth.peer_id: admission.revocation(auth, RUN, [me.peer_id], NOW)})
    kept = KeptRevocations(Gate(RUN, None, dht.now), dht, tmp_path / "r.msgpack", every_s=0.0)  # type: ignore[arg-type]
    kept.refresh()
    assert kept.lists == [] and dht.stores == 0 and not (tmp_path / "r.msgpack").exists()

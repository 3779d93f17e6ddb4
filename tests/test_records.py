"""The strict records that travel through the DHT: round trips, bounds, and the agreement rules."""

from __future__ import annotations

import hashlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradnode.protocol.errors import ProtocolError
from gradnode.protocol.records import (FINGERPRINT_BYTES, MAX_PEERS_PER_ROUND, MAX_RECORD_BYTES, Holdings, Report,
                                       RecordError, UpdateAnnouncement, WeightHash, fingerprint,
                                       majority_hash, pack, report_digest, resolve)

A = "QmYzqWF8yvd4ihZ6sMsf9zDEeoHEbNEKdDi7vvEEE7CebL"
B = "Qmec4pi4nN8WCknG7kSjyrc4n7LdYmNTs117BgTRvTjC1H"
D = "ab" * 32


def ann(**kw) -> UpdateAnnouncement:
    base = dict(run_id="run", round=3, sender=A, digest=D, size=100, tokens=10, time=1.0)
    return UpdateAnnouncement(**{**base, **kw})


def test_round_trip_and_signing_bytes_exclude_signature() -> None:
    rec = ann().signed(b"s" * 256)
    back = UpdateAnnouncement.from_bytes(rec.to_bytes())
    assert back == rec
    assert back.signing_bytes() == ann().signing_bytes()
    assert ann(round=4).signing_bytes() != ann().signing_bytes()


def test_proposal_round_trip_keeps_the_updates_and_resolves_them_against_announcements() -> None:
    p = Report(run_id="run", round=1, witness=A, included=pack([(B, D), (A, D), (A, D)]))
    back = Report.from_bytes(p.to_bytes())
    assert len(back.included) == 2 * FINGERPRINT_BYTES  # duplicates dropped
    other = "cd" * 32
    assert resolve(back.included, [(A, D), (B, other), (B, D)]) == ([(A, D), (B, D)], 0)
    assert resolve(back.included, [(A, D), (B, other)]) == ([(A, D)], 1)  # B's announced digest is another one
    assert fingerprint(A, D) != fingerprint(B, D) != fingerprint(A, other)


# A signed report as the code encoded it while its base was still the field ``seed`` (msgpack, hex)
REPORT_WIRE = ("92a67265706f727487a672756e5f6964a372756ea97369676e6174757265c403736967a5726f756e6407a77769746e657373"
               "b43131313131313131313131313131313131313131a473656564d92061626162616261626162616261626162616261626162"
               "61626162616261626162a8696e636c75646564c4108ff24dc09b73a71af5161c099c98b8a7a76162737461696ec2")


def test_a_reports_base_travels_under_the_key_seed_and_its_bytes_are_unchanged() -> None:
    """``Report.base`` is encoded under the wire key ``seed``: the bytes, the signing bytes and the digest of a
    report are those of peers that named the field so (records on the wire and signatures stay valid). The
    Python name is no wire key: a record keyed ``base`` is malformed."""
    rec = Report(run_id="run", round=7, witness="1" * 20, base="ab" * 16, included=pack([("s", "d" * 64)]),
                 signature=b"sig")
    assert rec.to_bytes().hex() == REPORT_WIRE
    kind, body = msgpack.unpackb(rec.to_bytes())
    assert kind == "report" and body["seed"] == "ab" * 16 and "base" not in body
    assert rec.signing_bytes() == msgpack.packb([kind, {k: v for k, v in body.items() if k != "signature"}])
    assert report_digest(rec) == "308e05e23af1c76670e24b13b1e606a4"
    assert Report.from_bytes(bytes.fromhex(REPORT_WIRE)) == rec
    body["base"] = body.pop("seed")
    with pytest.raises(RecordError, match="base"):
        Report.from_bytes(msgpack.packb([kind, body]))


def _peer(i: int) -> str:
    """A well-formed base58 peer id, one per i."""
    import base58

    return base58.b58encode(b"\x12\x20" + hashlib.sha256(str(i).encode()).digest()).decode()


@pytest.mark.parametrize("members", [8, 64, 512])
def test_round_records_of_a_large_swarm_fit_the_record_limit(members: int) -> None:
    """Witness report, weight report and holdings of a round with ``members`` updates, signed (RSA-2048: 256
    bytes), and a decision. Spelled out, each (sender, digest) pair cost ~115 bytes: past ~140 the report
    broke 16 KiB. Sizes in bytes (report, weight report, holdings): 8 members 605, 615, 517; 64 members
    1502, 1512, 1414; 512 members 8670, 8680, 8582 (a report names its chain: 71 bytes of base). The pairs
    spelled out alone: 921, 7363, 58883."""
    pairs = [(_peer(i), f"{i:064x}") for i in range(members)]
    sig = b"s" * 256
    recs = [Report(run_id="gradnode-demo-0123456789abcdef", round=10**6, witness=pairs[0][0], base="f" * 64,
                     included=pack(pairs)),
            WeightHash(run_id="gradnode-demo-0123456789abcdef", round=10**6, peer=pairs[0][0], param_hash="f" * 64,
                       included=pack(pairs), update_bytes=2**30),
            Holdings(run_id="gradnode-demo-0123456789abcdef", round=10**6, peer=pairs[0][0], held=pack(pairs))]
    spelled = len(msgpack.packb([list(p) for p in pairs]))
    for rec in recs:
        size = len(rec.signed(sig).to_bytes())
        assert size <= 16 * members + 512, (rec.kind, members, size)  # 16 bytes an update, plus a fixed part
        assert size < MAX_RECORD_BYTES and (members < 64 or size < spelled / 4)
        assert type(rec).from_bytes(rec.signed(sig).to_bytes()) == rec.signed(sig)
    assert MAX_PEERS_PER_ROUND >= 512 and 16 * MAX_PEERS_PER_ROUND + 512 < MAX_RECORD_BYTES


@pytest.mark.parametrize("bad", [
    b"", b"\xc1", msgpack.packb(["update", {"run_id": "run"}]), msgpack.packb(["weights", {}]), msgpack.packb(7),
    msgpack.packb(["update", {**ann().model_dump(), "extra": 1}]),
    msgpack.packb(["update", {**ann().model_dump(), "round": "3"}]),  # strict: no coercion
    msgpack.packb(["update", {**ann().model_dump(), "round": -1}]),
    msgpack.packb(["update", {**ann().model_dump(), "digest": "zz"}]),
    msgpack.packb(["update", {**ann().model_dump(), "sender": "not a peer id!"}]),
    b"\0" * (MAX_RECORD_BYTES + 1),
])
def test_malformed_records_raise_record_error(bad: bytes) -> None:
    with pytest.raises(RecordError):
        UpdateAnnouncement.from_bytes(bad)
    assert issubclass(RecordError, ProtocolError) and issubclass(RecordError, ValueError)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_escape_as_other_errors(data: bytes) -> None:
    try:
        UpdateAnnouncement.from_bytes(data)
    except RecordError:
        pass


def test_proposal_size_is_bounded() -> None:
    with pytest.raises(ValueError):
        Report(run_id="run", round=1, witness=A, included=b"x" * FINGERPRINT_BYTES * (MAX_PEERS_PER_ROUND + 1))
    with pytest.raises(ValueError):  # a torn fingerprint
        Report(run_id="run", round=1, witness=A, included=b"x" * (FINGERPRINT_BYTES + 1))


def test_majority_hash_prefers_a_majority_then_the_lowest_peer() -> None:
    def wh(peer: str, h: str) -> WeightHash:
        return WeightHash(run_id="run", round=0, peer=peer, param_hash=h)
    c = "Qmaoyr4dkwzyCZ4QLpYRRbAV5S6Ggp3ou4vusgAtKZ14Kn"
    low, high = sorted([A, B])
    assert majority_hash([wh(A, "aa" * 8), wh(B, "aa" * 8), wh(c, "bb" * 8)]) == ("aa" * 8, 2)
    assert majority_hash([wh(c, "bb" * 8), wh(B, "aa" * 8), wh(A, "aa" * 8)]) == ("aa" * 8, 2)
    # a 1-1 split resolves to the lowest peer's hash, whatever the order the reports arrive in
    assert majority_hash([wh(low, "cc" * 8), wh(high, "dd" * 8)]) == ("cc" * 8, 1)
    assert majority_hash([wh(high, "dd" * 8), wh(low, "cc" * 8)]) == ("cc" * 8, 1)
    # one vote per peer: repeating a report does not outvote another peer
    assert majority_hash([wh(high, "dd" * 8), wh(high, "dd" * 8), wh(low, "cc" * 8)]) == ("cc" * 8, 1)
    assert majority_hash([]) is None
    # a tie goes to a group holding a peer that serves its state (accepts streams) first: the lowest peer a
    # client-mode one, the other side would have to download from a peer nobody can dial
    assert majority_hash([wh(low, "cc" * 8), wh(high, "dd" * 8)], serving={high}) == ("dd" * 8, 1)
    assert majority_hash([wh(low, "cc" * 8), wh(high, "dd" * 8)], serving={low, high}) == ("cc" * 8, 1)
    assert majority_hash([wh(low, "cc" * 8), wh(high, "dd" * 8)], serving=set()) == ("cc" * 8, 1)
    # a strict majority stands, served or not
    assert majority_hash([wh(A, "aa" * 8), wh(B, "aa" * 8), wh(c, "bb" * 8)], serving={c}) == ("aa" * 8, 2)


def test_update_sender_reads_the_sender_back_from_an_update_name() -> None:
    from gradnode.protocol.records import state_chunk_name, update_name, update_sender

    assert update_sender(update_name("run", 7, A)) == A
    assert update_sender(state_chunk_name("run", 7, D)) is None


def test_a_set_spelled_out_from_the_network_is_parsed_strictly() -> None:
    """The fallback when a fingerprint names no announcement in sight, and how a decided set is fetched: a
    witness serves its report spelled out, a decider its set (a msgpack list of [sender, digest]); what comes
    back is hostile bytes until it parses strictly and its fingerprints equal the signed record's."""
    from gradnode.node.swarm.agreement import spelled_out as _pairs

    good = msgpack.packb([[A, D], [B, D]])
    assert _pairs(good) == [(A, D), (B, D)] and pack(_pairs(good) or []) == pack([(B, D), (A, D)])
    for bad in (b"", b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([[A]]), msgpack.packb([[A, 7]]),
                msgpack.packb([["x" * 200, D]]), msgpack.packb([[A, D]] * (MAX_PEERS_PER_ROUND + 1))):
        assert _pairs(bad) is None, bad[:20]


def test_a_kept_list_of_signed_records_is_parsed_strictly() -> None:
    from gradnode.protocol.records import (FINISHED_MAX_BYTES, KEPT_FINISHED_MAX, KEPT_REVOCATIONS_MAX,
                                           REVOCATION_MAX_BYTES, RecordError, kept_blob, kept_finished_of,
                                           kept_revocations_of)

    assert kept_finished_of(kept_blob([b"x", b"y" * 700])) == [b"x", b"y" * 700]
    for bad in (msgpack.packb({"a": 1}), msgpack.packb(["text"]), msgpack.packb([1]), msgpack.packb([[b"x"]]),
                msgpack.packb([b"x" * (FINISHED_MAX_BYTES + 1)], use_bin_type=True), b"\xc1", b"",
                msgpack.packb([b"x"] * (KEPT_FINISHED_MAX + 1), use_bin_type=True), "str", None):
        with pytest.raises(RecordError):
            kept_finished_of(bad)  # type: ignore[arg-type]
    # a bootstrap's revocation lists: fewer and larger
    assert kept_revocations_of(kept_blob([b"z" * REVOCATION_MAX_BYTES])) == [b"z" * REVOCATION_MAX_BYTES]
    for bad in (kept_blob([b"x"] * (KEPT_REVOCATIONS_MAX + 1)), kept_blob([b"x" * (REVOCATION_MAX_BYTES + 1)])):
        with pytest.raises(RecordError):
            kept_revocations_of(bad)


@given(st.binary(max_size=512))
def test_random_bytes_as_a_kept_list_raise_record_error_only(data: bytes) -> None:
    from gradnode.protocol.records import RecordError, kept_finished_of

    try:
        assert all(isinstance(r, bytes) for r in kept_finished_of(data))
    except RecordError:
        pass

"""The strict records that travel through the DHT: round trips, bounds, and the agreement rules."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gradnode.protocol.errors import ProtocolError
from gradnode.protocol.records import (MAX_RECORD_BYTES, Proposal, RecordError, UpdateAnnouncement, WeightHash,
                                       leader, majority_hash)

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


def test_proposal_round_trip_keeps_pairs() -> None:
    p = Proposal(run_id="run", round=1, proposer=A, included=[(A, D), (B, D)])
    assert Proposal.from_bytes(p.to_bytes()).included == [(A, D), (B, D)]


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
        Proposal(run_id="run", round=1, proposer=A, included=[(A, D)] * 257)


def test_leader_is_lowest_proposer_whatever_the_order() -> None:
    pa = Proposal(run_id="run", round=1, proposer=A, included=[])
    pb = Proposal(run_id="run", round=1, proposer=B, included=[(B, D)])
    assert leader([pb, pa]) is pa and leader([pa, pb]) is pa
    assert leader([pb]) is pb and leader([]) is None


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


def test_update_sender_reads_the_sender_back_from_an_update_name() -> None:
    from gradnode.protocol.records import state_chunk_name, update_name, update_sender

    assert update_sender(update_name("run", 7, A)) == A
    assert update_sender(state_chunk_name("run", 7, D)) is None

"""Identity: stable key file, libp2p peer id, signatures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gradnode.node.swarm.identity import IdentityError, load_or_create, peer_id_from_public_der, verify


def test_key_file_is_created_once_and_reused(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "identity.key"
    first = load_or_create(path)
    assert oct(os.stat(path).st_mode & 0o777) == "0o400"
    again = load_or_create(path)
    assert again.peer_id == first.peer_id and first.peer_id.startswith("Qm")


def test_peer_id_matches_hivemind(tmp_path: Path) -> None:
    from hivemind.p2p import PeerID

    ident = load_or_create(tmp_path / "k")
    assert PeerID.from_identity((tmp_path / "k").read_bytes()).to_base58() == ident.peer_id
    assert peer_id_from_public_der(ident.public_der) == ident.peer_id


def test_sign_verify_and_tampering(tmp_path: Path) -> None:
    a, b = load_or_create(tmp_path / "a"), load_or_create(tmp_path / "b")
    sig = a.sign(b"round 3")
    assert verify(a.public_der, b"round 3", sig)
    assert not verify(a.public_der, b"round 4", sig)
    assert not verify(b.public_der, b"round 3", sig)
    assert not verify(b"garbage", b"round 3", sig)
    assert not verify(a.public_der, b"round 3", sig[:-1] + bytes([sig[-1] ^ 1]))


def test_kept_answers_are_the_answers_of_the_exact_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify keeps its answers by a digest of the three byte strings: asked again, a good signature still
    verifies and a bad one still fails; bytes that only concatenate alike are another question; other
    buffer types are refused and not kept; and no more than VERIFIED answers are kept."""
    from gradnode.node.swarm import identity

    a = load_or_create(tmp_path / "a")
    sig = a.sign(b"round 3")
    for _ in range(2):
        assert verify(a.public_der, b"round 3", sig)
        assert not verify(a.public_der, b"round 4", sig)
        assert not verify(a.public_der, b"round 3" + sig[:1], sig[1:])  # the same bytes, split elsewhere
    kept = len(identity._answers)
    assert not verify(bytearray(a.public_der), b"round 3", sig)  # a key must be bytes, as before
    assert len(identity._answers) == kept
    monkeypatch.setattr(identity, "VERIFIED", 3)
    for i in range(10):
        assert not verify(a.public_der, b"round %d" % (10 + i), sig)
    assert len(identity._answers) == 3


def test_corrupt_key_file_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.key"
    path.write_bytes(b"not a key")
    with pytest.raises(IdentityError):
        load_or_create(path)

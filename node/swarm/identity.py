"""A peer's identity: an RSA key kept in a file, its libp2p peer id, and signatures.

The key file uses libp2p's format (a protobuf ``PrivateKey`` holding an RSA key in DER), so the same
file is handed to hivemind's P2P daemon: the peer id the daemon announces is the one computed here,
and a signature made with this key proves it came from that peer id. No hivemind import here
(transport.py is the only module that imports it); the key format is a few bytes of protobuf.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import base58
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

log = logging.getLogger(__name__)

_RSA = 0  # libp2p crypto.pb.KeyType.RSA
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=32)
MAX_PUBLIC_KEY_BYTES = 1024
SIGNATURE_BYTES = 256  # RSA-2048


class IdentityError(ValueError):
    """A key file or public key is unreadable or malformed."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _encode_key_pb(data: bytes) -> bytes:
    """libp2p ``{Private,Public}Key{key_type: RSA, data}`` as protobuf bytes."""
    return b"\x08" + _varint(_RSA) + b"\x12" + _varint(len(data)) + data


def _decode_key_pb(blob: bytes) -> bytes:
    if len(blob) < 4 or blob[0] != 0x08 or blob[1] != _RSA or blob[2] != 0x12:
        raise IdentityError("not an RSA key in libp2p protobuf format")
    length, shift, pos = 0, 0, 3
    while pos < len(blob):
        byte = blob[pos]
        length |= (byte & 0x7F) << shift
        pos += 1
        shift += 7
        if not byte & 0x80:
            break
    if pos + length != len(blob):
        raise IdentityError("truncated key file")
    return blob[pos:]


def public_key_der(key: rsa.RSAPublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def peer_id_from_public_der(der: bytes) -> str:
    """libp2p peer id (base58 sha2-256 multihash of the protobuf public key), as hivemind prints it."""
    digest = hashlib.sha256(_encode_key_pb(der)).digest()
    return base58.b58encode(b"\x12\x20" + digest).decode()


def peer_id_from_dht_owner(subkey: bytes) -> str | None:
    """The peer id behind a DHT subkey protected by hivemind's RSASignatureValidator
    (``[owner:ssh-rsa ...]``): only that key's holder can store under it. None for anything else."""
    if not (isinstance(subkey, bytes) and subkey.startswith(b"[owner:") and subkey.endswith(b"]")):
        return None
    try:
        key = serialization.load_ssh_public_key(subkey[len(b"[owner:"):-1])
    except (ValueError, TypeError, serialization.UnsupportedAlgorithm):
        return None
    if not isinstance(key, rsa.RSAPublicKey):
        return None
    return peer_id_from_public_der(public_key_der(key))


def load_public_key(der: bytes) -> rsa.RSAPublicKey:
    if not isinstance(der, bytes) or not 0 < len(der) <= MAX_PUBLIC_KEY_BYTES:
        raise IdentityError("public key missing or too large")
    try:
        key = serialization.load_der_public_key(der)
    except ValueError as err:
        raise IdentityError(f"bad public key: {err}") from None
    if not isinstance(key, rsa.RSAPublicKey) or key.key_size != 2048:
        raise IdentityError("public key must be RSA-2048")
    return key


def verify(public_der: bytes, message: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is this key's signature of ``message``; False for any malformed input.

    The answers for the last VERIFIED triples are kept, by a digest of their bytes: a peer reads the same
    records again at every poll (a member record until its next heartbeat, every announcement and report of a
    round), and the answer is a function of the bytes alone. A check costs ~33 us on RSA-2048 (this machine),
    the digest 1-8 us; in a 9-peer swarm the checks were ~7% of a peer's CPU before the answers were kept."""
    if not (type(public_der) is bytes and type(message) is bytes and type(signature) is bytes):
        return _check(public_der, message, signature)
    key = hashlib.sha256(b"%d:%d:" % (len(public_der), len(message)) + public_der + message + signature).digest()
    with _answers_lock:
        known = _answers.get(key)
        if known is not None:
            _answers.move_to_end(key)
            return known
    ok = _check(public_der, message, signature)
    with _answers_lock:
        _answers[key] = ok
        while len(_answers) > VERIFIED:
            _answers.popitem(last=False)
    return ok


VERIFIED = 8192  # answers kept (~0.8 MB)
_answers: OrderedDict[bytes, bool] = OrderedDict()
_answers_lock = threading.Lock()


def _check(public_der: bytes, message: bytes, signature: bytes) -> bool:
    try:
        load_public_key(public_der).verify(signature, message, _PSS, hashes.SHA256())
        return True
    except (InvalidSignature, IdentityError, TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Identity:
    """A loaded private key with its public key and peer id."""

    path: Path
    private_key: rsa.RSAPrivateKey

    @property
    def public_der(self) -> bytes:
        return public_key_der(self.private_key.public_key())

    @property
    def peer_id(self) -> str:
        return peer_id_from_public_der(self.public_der)

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message, _PSS, hashes.SHA256())


def load_or_create(path: Path) -> Identity:
    """Load the key at ``path``; create it (mode 0400) on first start so the peer id stays stable."""
    path = Path(path)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
        tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
        tmp.write_bytes(_encode_key_pb(der))
        os.chmod(tmp, 0o400)
        os.replace(tmp, path)
        log.info("identity created path=%s", path)
    try:
        der = _decode_key_pb(path.read_bytes())
        key = serialization.load_der_private_key(der, password=None)
    except (OSError, ValueError) as err:
        raise IdentityError(f"cannot read identity {path}: {err}") from None
    if not isinstance(key, rsa.RSAPrivateKey) or key.key_size != 2048:
        raise IdentityError(f"identity {path} must hold an RSA-2048 key")
    return Identity(path=path, private_key=key)

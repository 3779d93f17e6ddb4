"""Strict records that travel through the DHT: membership, update announcements, witness reports,
weight hashes and state manifests.

Every record is a frozen pydantic model with bounded fields, serialised as msgpack (a few hundred
bytes; DHT values stay far below 32 KiB). ``signing_bytes()`` is the canonical byte string a peer
signs (every field but the signature, keys sorted); checking the signature is the runtime's job (this
package stays free of keys and clocks). ``from_bytes`` raises ``RecordError`` for anything malformed.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Collection, Iterable, Mapping
from typing import Annotated, ClassVar, Literal, TypeVar

import msgpack
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gradnode.protocol.errors import ProtocolError

# 2: updates named by fingerprint; 3: state hash, proposals naming their base state, decisions; 4: witness reports;
# 5: state manifests name their chunk list by its digest
PROTOCOL_VERSION = 5
MAX_RECORD_BYTES = 16 * 1024
MAX_PEERS_PER_ROUND = 768
FINGERPRINT_BYTES = 16
MIN_STATE_CHUNK = 1 << 16  # bytes: a state of 2**40 bytes has at most 2**24 chunks, a chunk list of 512 MiB
CHUNK_DIGEST_BYTES = 32

PeerId = Annotated[str, StringConstraints(min_length=20, max_length=64, pattern=r"^[1-9A-HJ-NP-Za-km-z]+$")]
RunId = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
Digest = Annotated[str, StringConstraints(min_length=64, max_length=64, pattern=r"^[0-9a-f]+$")]
Maddr = Annotated[str, StringConstraints(min_length=1, max_length=256)]
Signature = Annotated[bytes, Field(min_length=1, max_length=512)]
Round = Annotated[int, Field(ge=0, le=2**40)]
Hash = Annotated[str, StringConstraints(min_length=8, max_length=128, pattern=r"^[0-9a-f]+$")]


def _whole_fingerprints(v: bytes) -> bytes:
    if len(v) % FINGERPRINT_BYTES:
        raise ValueError(f"length {len(v)} is not a multiple of {FINGERPRINT_BYTES}")
    return v


# A set of updates, compactly: their fingerprints (see ``fingerprint``), sorted and concatenated
Fingerprints = Annotated[bytes, Field(max_length=FINGERPRINT_BYTES * MAX_PEERS_PER_ROUND),
                         AfterValidator(_whole_fingerprints)]


@functools.lru_cache(maxsize=1 << 14)  # a round's pairs are packed by every witness and resolved by every peer (~4 MB)
def fingerprint(sender: str, digest: str) -> bytes:
    """16 bytes naming one update: ``sender``'s blob with sha256 ``digest``. Witness reports, weight reports and
    holdings list updates by fingerprint (16 bytes each instead of ~115 for the pair spelled out), so a
    record of 512 updates stays near 8 KiB; readers resolve them against the round's signed
    announcements, which carry the pairs. Finding two pairs with one fingerprint takes ~2^64 hashes."""
    return hashlib.sha256(f"{sender}/{digest}".encode()).digest()[:FINGERPRINT_BYTES]


def pack(pairs: Iterable[tuple[str, str]]) -> bytes:
    """The fingerprints of (sender, digest) pairs, sorted, without duplicates, concatenated."""
    return b"".join(sorted({fingerprint(s, d) for s, d in pairs}))


def unpack(fps: bytes) -> list[bytes]:
    return [fps[i:i + FINGERPRINT_BYTES] for i in range(0, len(fps), FINGERPRINT_BYTES)]


def resolve(fps: bytes, known: Iterable[tuple[str, str]]) -> tuple[list[tuple[str, str]], int]:
    """The (sender, digest) pairs of ``fps`` found among ``known`` (sorted), and how many were not found."""
    wanted = set(unpack(fps))
    found = sorted({(s, d) for s, d in known if fingerprint(s, d) in wanted})
    return found, len(wanted) - len(found)


class RecordError(ProtocolError):
    """A record read from the network is malformed, oversized or of the wrong kind."""


R = TypeVar("R", bound="Record")


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    kind: ClassVar[str] = "record"

    run_id: RunId
    signature: Signature = b"\0"

    def signing_bytes(self) -> bytes:
        body = self.model_dump(by_alias=True, exclude={"signature"})
        return msgpack.packb([self.kind, body], use_bin_type=True)

    def to_bytes(self) -> bytes:
        data = msgpack.packb([self.kind, self.model_dump(by_alias=True)], use_bin_type=True)
        assert len(data) <= MAX_RECORD_BYTES, f"{self.kind} record of {len(data)} bytes is too large"
        return data

    def signed(self: R, signature: bytes) -> R:
        return self.model_copy(update={"signature": signature})

    @classmethod
    def from_bytes(cls: type[R], data: bytes) -> R:
        if not isinstance(data, bytes) or len(data) > MAX_RECORD_BYTES:
            raise RecordError(f"{cls.kind} record missing or larger than {MAX_RECORD_BYTES} bytes")
        try:
            kind, body = msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as err:
            raise RecordError(f"undecodable {cls.kind} record: {err}") from None
        if kind != cls.kind or not isinstance(body, dict):
            raise RecordError(f"expected a {cls.kind} record, got {str(kind)[:32]!r}")
        unknown = set(body) - _wire_keys(cls)
        if unknown:  # a field's Python name where the wire has its alias is no key of the wire either
            raise RecordError(f"invalid {cls.kind} record: unknown key {str(min(map(str, unknown)))[:32]!r}")
        try:
            return cls.model_validate(_tuples(cls, body))
        except ValidationError as err:
            raise RecordError(f"invalid {cls.kind} record: {err.errors()[0]['loc']} {err.errors()[0]['msg']}") \
                from None


@functools.lru_cache(maxsize=None)
def _wire_keys(cls: type[Record]) -> frozenset[str]:
    """The keys of ``cls``'s msgpack map: each field's serialization alias, else its name."""
    return frozenset(f.serialization_alias or name for name, f in cls.model_fields.items())


def _tuples(cls: type[Record], body: dict) -> dict:
    """msgpack gives lists; strict pydantic wants tuples where the model says tuple."""
    out = dict(body)
    for name in getattr(cls, "_tuple_lists", ()):
        if isinstance(out.get(name), list):
            out[name] = [tuple(x) if isinstance(x, list) else x for x in out[name]]
    return out


class MemberRecord(Record):
    """A peer's signed, expiring presence: who it is, where to reach it, how fast it trains."""

    kind: ClassVar[str] = "member"
    _tuple_lists: ClassVar[tuple[str, ...]] = ("chain", "scores")
    peer_id: PeerId
    public_key: bytes = Field(min_length=64, max_length=1024, description="RSA public key, DER (SPKI).")
    maddrs: list[Maddr] = Field(max_length=16)
    round: Round
    training: bool
    step_seconds: float = Field(ge=0.0, le=1e5, description="Observed seconds per inner step (0: unknown).")
    inner_steps: int = Field(ge=0, le=10**6, description="Inner steps this peer runs per full round.")
    tokens_per_s: float = Field(ge=0.0, le=1e12)
    bytes_up: int = Field(ge=0, le=2**62)
    bytes_down: int = Field(ge=0, le=2**62)
    rejected: int = Field(ge=0, le=2**40)
    loss: float | None = Field(default=None, ge=0.0, le=1e6)
    software_version: str = Field(max_length=32)
    protocol_version: int = Field(ge=0, le=2**16)
    time: float = Field(ge=0.0, le=1e11)
    leaving: bool = False
    reachable: bool = Field(True, description="Accepts inbound streams; False for a client-mode peer (behind "
                                              "NAT), whose updates others fetch from the peers it pushed them to.")
    chain: list[tuple[Round, Hash]] = Field(default_factory=list, max_length=8,
                                            description="The newest states this peer holds, (round r, weight "
                                                        "hash after applying r), oldest first (protocol/chain.py).")
    ignoring: list[PeerId] = Field(default_factory=list, max_length=16,
                                   description="Senders this peer currently ignores for repeated invalid updates.")
    admission: bytes = Field(b"", max_length=2048, description="Its Admission record, signed by the run "
                                                               "authority (permissioned runs; empty in open ones).")
    scores: list[tuple[PeerId, Annotated[float, Field(ge=0.0, le=1.0)]]] = Field(
        default_factory=list, max_length=16, description="The lowest reputation scores of the run's table as this "
                                                         "peer holds it (protocol/reputation.py; 1.0 when absent).")


class Admission(Record):
    """The run authority admits ``peer`` to the run until ``expires`` (unix time); signed by the authority
    key the run's genesis names (protocol/genesis.py), issued with `gradnode admit`."""

    kind: ClassVar[str] = "admission"
    peer: PeerId
    expires: float = Field(ge=0.0, le=1e11)


REVOKED_MAX = 256  # peers in one revocation list


class Revocation(Record):
    """The run authority withdraws admissions: every peer listed here is out, whatever its certificate. Lists
    add up: a peer named in any list the authority signed for the run is out for good (``time``: when it was
    signed, for people; the newest list holds every peer of those before it, as ``gradnode revoke`` writes it)."""

    kind: ClassVar[str] = "revocation"
    revoked: list[PeerId] = Field(max_length=REVOKED_MAX)
    time: float = Field(ge=0.0, le=1e11)


class UpdateAnnouncement(Record):
    """'My compressed update for round r has this digest and size and stands for these tokens.'"""

    kind: ClassVar[str] = "update"
    round: Round
    sender: PeerId
    digest: Digest
    size: int = Field(ge=1, le=2**34)
    tokens: int = Field(ge=0, le=2**50)
    time: float = Field(ge=0.0, le=1e11)


class Report(Record):
    """A witness's report of round r at its deadline: the updates it fetched and verified (fingerprints),
    on its chain (``base``: the state hash the round builds on; ``seed`` on the wire). An update is in the
    round when a strict majority of the eligible witnesses' reports list it (protocol/witness.py). A report is
    final once published: a second, different one for the round and chain, an abstention included, is
    equivocation.

    ``abstain``: the witness sits this round out (a straggler skipping ahead to the next round); nobody
    waits for its report."""

    model_config = ConfigDict(populate_by_name=True)
    kind: ClassVar[str] = "report"
    round: Round
    witness: PeerId
    base: str = Field("", max_length=128, pattern=r"^[0-9a-f]*$", validation_alias="seed", serialization_alias="seed",
                      description="The state hash the witness's previous round agreed on: the state this round "
                                  "builds on (its chain).")
    included: Fingerprints = b""
    abstain: bool = False


def report_digest(p: Report) -> str:
    """What a report says (its chain's base, its fingerprints, or that it abstains), hashed: two reports of
    one witness for one round and base with different digests are equivocation, provable by showing both
    signed records (a peer rolled back onto another chain reports again, on another base)."""
    return hashlib.blake2b(p.base.encode() + b"/" + p.included + bytes([p.abstain]), digest_size=16).hexdigest()


class Equivocation(Record):
    """``reporter`` holds two reports ``accused`` signed for round r, with the digests ``first`` and ``second``,
    and serves both (equivocation.evidence_name): anyone can fetch them and check the signatures."""

    kind: ClassVar[str] = "equivocation"
    round: Round
    reporter: PeerId
    accused: PeerId
    first: Hash
    second: Hash


class WeightHash(Record):
    """The hash of a peer's shared weights after applying round r, and what it applied to get there:
    the round's updates (fingerprints of their (sender, digest) pairs) and their total size. A peer that missed round r replays
    exactly those updates (fetched from the peers reporting the majority hash, who hold them) and
    checks that it lands on ``param_hash``."""

    kind: ClassVar[str] = "weights"
    round: Round
    peer: PeerId
    param_hash: Hash
    included: Fingerprints = b""
    update_bytes: int = Field(0, ge=0, le=2**50, description="Total size of the included update blobs.")


class Finished(Record):
    """A peer reached the run's last round (``round``: the rounds it applied) on weights of ``param_hash``. It
    outlives the peer's member record by days (a peer that comes back after the others finished finds it), so it
    carries its author's public key: verified on its own (the key must hash to ``peer``)."""

    kind: ClassVar[str] = "finished"
    peer: PeerId
    public_key: bytes = Field(min_length=64, max_length=1024, description="RSA public key, DER (SPKI).")
    round: Round
    param_hash: Hash
    time: float = Field(ge=0.0, le=1e11)


class Holdings(Record):
    """The updates of round r that a peer holds and serves (gossip: fetchers spread over holders)."""

    kind: ClassVar[str] = "holdings"
    round: Round
    peer: PeerId
    held: Fingerprints = b""


class StateManifest(Record):
    """A peer offers its shared state after round ``round``: its size, weight hash, chunk size and chunk list.

    The chunk list (the sha256 of every chunk, 32 bytes each, in order) is a blob of its own, named and checked
    by its sha256 (``chunk_list``): a manifest stays a few hundred bytes whatever the state's size, where 64
    hex digits per chunk passed the record bound at about 1 GB of state."""

    kind: ClassVar[str] = "state"
    round: Round
    peer: PeerId
    param_hash: Hash
    size: int = Field(ge=1, le=2**40)
    chunk_bytes: int = Field(ge=MIN_STATE_CHUNK, le=2**30)  # every chunk but the last
    chunk_list: Digest
    time: float = Field(ge=0.0, le=1e11)

    @property
    def chunk_count(self) -> int:
        return -(-self.size // self.chunk_bytes)

    @property
    def chunk_list_bytes(self) -> int:
        """The size of the chunk list blob."""
        return CHUNK_DIGEST_BYTES * self.chunk_count

    @property
    def chunks(self) -> tuple[str]:
        """What offers are grouped by (protocol/sync.py ``download_order``): one chunk list digest, one list."""
        return (self.chunk_list,)


def chunk_list(digests: Iterable[bytes]) -> bytes:
    """A state's chunk list: the sha256 digests of its chunks, in order, concatenated."""
    return b"".join(digests)


def chunk_digests(data: bytes, manifest: StateManifest) -> list[str]:
    """The hex chunk digests of a chunk list fetched for ``manifest``; RecordError unless it is exactly the list
    the manifest names (its sha256, its length)."""
    if len(data) != manifest.chunk_list_bytes or hashlib.sha256(data).hexdigest() != manifest.chunk_list:
        raise RecordError("chunk list does not match its manifest")
    return [data[i:i + CHUNK_DIGEST_BYTES].hex() for i in range(0, len(data), CHUNK_DIGEST_BYTES)]


def update_name(run_id: str, round_: int, sender: str) -> str:
    """Blob name under which an update is served."""
    return f"u/{run_id}/{round_}/{sender}"


def update_sender(name: str) -> str | None:
    """The sender in an update's blob name (see update_name); None for any other blob."""
    return name.rsplit("/", 1)[-1] if name.startswith("u/") else None


def report_list_name(run_id: str, round_: int, witness: str) -> str:
    """Blob under which a witness serves its report spelled out: the msgpack list of (sender, digest)."""
    return f"p/{run_id}/{round_}/{witness}"


def report_record_name(run_id: str, round_: int, witness: str) -> str:
    """Blob under which a witness serves its signed report record itself: read straight from its author when
    the DHT does not show it (right after a split heals, a record stored once sits on nodes a reader's
    lookups do not reach yet)."""
    return f"w/{run_id}/{round_}/{witness}"


def state_chunk_name(run_id: str, round_: int, digest: str) -> str:
    return f"s/{run_id}/{round_}/{digest}"


KEPT_FINISHED_MAX = 1024  # 'finished' records in one kept list (a bootstrap's: node/swarm/finished.py)
FINISHED_MAX_BYTES = 2048  # one signed 'finished' record (an RSA-2048 key and signature: about 700 bytes)
KEPT_REVOCATIONS_MAX = 8  # signed revocation lists a bootstrap keeps (node/swarm/admission.py KeptRevocations)
REVOCATION_MAX_BYTES = 24 * 1024  # one signed list: REVOKED_MAX ids of up to 64 characters, the signature


def kept_finished_name(run_id: str) -> str:
    """Blob under which a bootstrap serves the 'finished' records of its run it keeps (``kept_blob``)."""
    return f"f/{run_id}"


def kept_blob(raws: Iterable[bytes]) -> bytes:
    """The msgpack list of signed records, each as its author stored it (verified by the reader): what a bootstrap
    keeps of the run's end and of its revocations."""
    return msgpack.packb(list(raws), use_bin_type=True)


def _kept_of(blob: bytes, what: str, most: int, each: int) -> list[bytes]:
    """The records of a kept list, unverified; RecordError for anything but a list of at most ``most`` byte strings
    of at most ``each`` bytes."""
    if not isinstance(blob, bytes) or len(blob) > most * (each + 8):
        raise RecordError(f"kept {what} missing or too large")
    try:
        raws = msgpack.unpackb(blob, raw=False, use_list=True, max_array_len=most, max_bin_len=each,
                               max_str_len=0, max_map_len=0, max_ext_len=0)
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as err:
        raise RecordError(f"undecodable kept {what}: {err}") from None
    if not isinstance(raws, list) or not all(isinstance(r, bytes) for r in raws):
        raise RecordError(f"kept {what} hold byte strings only")
    return raws


def kept_finished_of(blob: bytes) -> list[bytes]:
    """A kept list of 'finished' records: at most ``KEPT_FINISHED_MAX`` of ``FINISHED_MAX_BYTES`` each."""
    return _kept_of(blob, "'finished' records", KEPT_FINISHED_MAX, FINISHED_MAX_BYTES)


def kept_revocations_of(blob: bytes) -> list[bytes]:
    """A kept list of revocation lists: at most ``KEPT_REVOCATIONS_MAX`` of ``REVOCATION_MAX_BYTES`` each."""
    return _kept_of(blob, "revocation lists", KEPT_REVOCATIONS_MAX, REVOCATION_MAX_BYTES)


Table = Literal["members", "updates", "reports", "equivocations", "weights", "state", "holdings", "revocations",
                "finished"]


def dht_key(run_id: str, what: Table, round_: int | None = None, part: int | None = None) -> str:
    """A table's DHT key, of one round or none, and of one of its parts (gossip.holdings_part) or the whole."""
    key = f"gradnode/{run_id}/{what}" + ("" if round_ is None else f"/{round_}")
    return key if part is None else f"{key}/p{part}"


def member_key(run_id: str, peer_id: str) -> str:
    """The DHT key of one peer's own member record (committee runs: protocol/roster.py)."""
    return f"gradnode/{run_id}/member/{peer_id}"


def majority_hash(hashes: list[WeightHash], moved: Mapping[str, str] | None = None,
                  serving: Collection[str] | None = None) -> tuple[str, int] | None:
    """The weight hash the swarm agrees on (one vote per peer), with its count. ``moved``: peers seen to follow
    another chain since they reported (peer -> that chain's hash of the round): their report is of a chain
    they have left, and counts for the one they follow now.

    A strict majority wins. Without one (e.g. two peers split 1-1 after a partition), the largest
    groups are tied and the group holding the lowest peer id wins, so that every peer resolves the split
    the same way instead of staying diverged (a key ground to the lowest id decides such ties: not
    defended yet, Trust II). With ``serving`` (the peers whose records say they accept streams), a tied group
    that holds one of them wins over one that does not: the losers must download the winners' state, and
    nobody can download from a client-mode peer (a fast peer and a client split 1-1 in a run's last round, the
    client's the lower id: the fast peer found no state to fetch, and the run ended on two hashes).
    """
    votes: dict[str, str] = {}
    for h in hashes:
        votes[h.peer] = (moved or {}).get(h.peer, h.param_hash)
    return majority_of(votes, serving)


def majority_of(votes: Mapping[str, str], serving: Collection[str] | None = None) -> tuple[str, int] | None:
    """``majority_hash`` over votes already counted (peer -> the hash it stands for): the largest group of equal
    hashes, a tie to one a serving peer holds, then to the one its lowest voter holds; with its count."""
    counts: dict[str, int] = {}
    for value in votes.values():
        counts[value] = counts.get(value, 0) + 1
    if not counts:
        return None
    top = max(counts.values())
    lowest_voter = {value: min(p for p, v in votes.items() if v == value) for value, n in counts.items() if n == top}
    served = {value: serving is None or any(p in serving for p, v in votes.items() if v == value)
              for value in lowest_voter}
    best = min(lowest_voter, key=lambda value: (not served[value], lowest_voter[value]))
    return best, top

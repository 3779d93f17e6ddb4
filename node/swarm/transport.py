"""The peer-to-peer transport: the only module that imports hivemind.

One hivemind DHT (its own process, with the libp2p daemon) carries small signed records; byte
payloads (compressed updates, state chunks) travel over libp2p streams registered on the DHT's own
daemon (``DHT.replicate_p2p()``), served from an in-memory blob store. Any peer that holds a blob
serves it, so a fetched update spreads like gossip. A token bucket caps the link when asked.

Threads: a private asyncio loop thread runs stream handlers and fetches; the public methods are
synchronous, safe to call from any thread, and bounded by timeouts. Network failures come back as
``None``/``False`` and a log line, never as an exception to the caller.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import functools
import logging
import random
import re
import shutil
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Iterable, Iterator

import hivemind
import msgpack
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.protocol import DHTProtocol
from hivemind.p2p import P2P, PeerID
from hivemind.utils import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.multiaddr import Multiaddr

from gradnode.node.config import SwarmConfig
from gradnode.node.swarm.identity import Identity, peer_id_from_dht_owner
from gradnode.protocol.gossip import CopyBudget, copy_window_s
from gradnode.protocol.records import update_sender
from gradnode.protocol.skew import MAX_SKEW_S, Sample

log = logging.getLogger(__name__)

_GET = "gradnode.get/1"
_PUSH = "gradnode.push/1"  # a client-mode peer hands its update to a reachable peer, which then serves it
_CHUNK = 64 * 1024
_HEADER = struct.Struct(">BQ")  # status, length
_MAX_REQUEST = 1024
_MAX_DHT_VALUE = 32 * 1024
_SOCKET_PREFIX_LOCK = threading.Lock()  # hivemind reads the socket folder from a class attribute
# A peer that cannot be reached (a split network drops packets: nothing is refused, everything hangs)
# must cost one attempt, not a whole deadline: opening a stream, and every piece of a transfer, is bounded.
_OPEN_S = 5.0
_STALL_S = 10.0
READ_SHARE_S = 0.2  # a DHT read this young answers another read of the same key (round.POLL_S: one poll)
SLOWHOLD_BYTES_PER_S = 128  # testing aid (swarm.fault = slowhold): how fast the adversary serves
Sources = list[tuple[str, list[str]]] | Callable[[], list[tuple[str, list[str]]]]


class Busy(Exception):
    """A peer that holds a blob answered that its slots for it are taken (``Transport._fetch``)."""


class TransportError(ValueError):
    """The peer-to-peer layer cannot start: no initial peer answers, a port is taken, an address is bad.
    The message names the address and what to check. ``unanswered``: nobody answered (a bootstrap being
    restarted comes back, so trying again can help); a taken port or a bad address stays as it is."""

    def __init__(self, message: str, unanswered: bool = False) -> None:
        super().__init__(message)
        self.unanswered = unanswered


# the words of hivemind's start when no initial peer answered: its daemon reached none, or reached one whose DHT did
# not answer a ping (a bootstrap still starting, or too busy to answer in time: a flake hunt saw a peer of a test
# swarm give up so, and the others wait for it to the test's end)
_UNANSWERED = ("failed to connect to bootstrap peers", "none of the initial_peers responded to a ping")


def _unanswered(text: str) -> bool:
    return any(words in text for words in _UNANSWERED)


# hivemind's words when an initial peer's clock (in its ping's answer) is more than 3 s off this one's
_CLOCKS = re.compile(r"local time must be within .*local: ([0-9.]+), peer: ([0-9.]+)", re.S)


def _clocks_apart(text: str) -> str | None:
    """What to do about a clock hivemind found off an initial peer's at the start, or None for other words."""
    found = _CLOCKS.search(text)
    if found is None:
        return None
    ahead = float(found.group(1)) - float(found.group(2))
    return (f"this machine's clock is {abs(ahead):.1f} s {'ahead of' if ahead > 0 else 'behind'} the initial "
            f"peer's (the DHT allows {MAX_SKEW_S:.0f} s: its records expire by wall-clock time): sync the clock "
            "(NTP, e.g. `timedatectl set-ntp true`), here or on the initial peer, whichever is wrong")


@contextlib.contextmanager
def socket_folder() -> Iterator[str]:
    """A new folder in the temp folder for a libp2p daemon's unix sockets (its name short: socket paths are capped
    at 107 bytes), hivemind's class-wide socket prefix while the block runs (under a lock: a daemon reads it as it
    starts). The caller removes the folder."""
    folder = tempfile.mkdtemp(prefix="gn-p2p-")
    with _SOCKET_PREFIX_LOCK:
        P2P._UNIX_SOCKET_PREFIX = f"/unix{folder}/hivemind-"
        yield folder


def fresh_locks() -> None:
    """New cross-process locks for hivemind, as a fresh process makes at its import. hivemind makes them at
    import (MPFuture's and SharedBytes', the async context wrapper's executor lock), to be shared by a process and
    the DHT process it forks. A process forked from another that imported hivemind (gradnode simulate's zygote)
    shares its parent's: every process of a swarm shared one set, and a process killed -9 while holding one (the
    result pipe's, taken for every result the DHT process hands back) left every other's DHT blocked on it for
    good: DHT reads timed out everywhere and restarted processes' DHTs never came up (tests/test_zygote.py holds
    the case). Call it in such a child before any DHT starts."""
    import multiprocessing

    from hivemind.utils.asyncio import _AsyncContextWrapper
    from hivemind.utils.mpfuture import MPFuture

    MPFuture.reset_backend()  # hivemind's own: MPFuture's and SharedBytes' locks anew, its backend unset
    _AsyncContextWrapper.EXECUTOR_LOCK = multiprocessing.Lock()


def explain_start_failure(err: BaseException, initial: list[str], hosts: list[str]) -> str:
    """One line for a libp2p daemon that did not start, in the user's terms (not the daemon's)."""
    text = str(err)
    clocks = _clocks_apart(text)
    if clocks is not None:
        return clocks
    if _unanswered(text):
        return (f"no initial peer answered ({', '.join(initial)}): check that a gradnode bootstrap or peer runs "
                "there, that the address, port and /p2p/ id are the ones it printed, and that no firewall blocks it")
    if "is already taken by another peer" in text:
        return ("another process runs this peer's key and reaches the swarm: stop it, or give this peer a key of its "
                "own (a run.output_dir of its own, or swarm.identity_path)")
    if "address already in use" in text:
        return (f"cannot listen on {', '.join(hosts)}: the port is in use by another process; pick another port "
                "(--host, or swarm.host_maddrs; /tcp/0 takes any free one)")
    if "multiaddr" in text or "p2p addr" in text:
        return f"a multiaddr was refused ({', '.join(initial + hosts)}): {text.splitlines()[-1].strip()}"
    return f"the libp2p daemon did not start: {text.strip().splitlines()[-1] if text.strip() else type(err).__name__}"


PORT_FREED_S = 10.0  # how long a second start waits for the port its failed first try's daemon listened on


def _check_ports_free(hosts: list[str], wait_s: float = 0.0) -> None:
    """TransportError for a fixed TCP port another process listens on (``/ip4/A/tcp/P``, P > 0): at once, or once
    it has not come free within ``wait_s``."""
    end = time.monotonic() + wait_s
    while True:
        try:
            _check_ports_free_now(hosts)
            return
        except TransportError:
            if time.monotonic() >= end:
                raise
            time.sleep(0.1)


def _check_ports_free_now(hosts: list[str]) -> None:
    import socket

    for maddr in hosts:
        parts = maddr.strip("/").split("/")
        if len(parts) < 4 or parts[0] not in ("ip4", "ip6") or parts[2] != "tcp" or parts[3] in ("", "0"):
            continue
        family = socket.AF_INET if parts[0] == "ip4" else socket.AF_INET6
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemon binds: TIME_WAIT is no user
            try:
                probe.bind((parts[1], int(parts[3])))
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    raise TransportError(explain_start_failure(OSError("address already in use"), [], hosts)) from err
                # anything else (an address not on this host...): the daemon's own words say it


def _without_peer_id(maddr: str) -> str:
    """The daemon dials a transport address; the /p2p/<id> part goes separately (as the peer id)."""
    return maddr.split("/p2p/")[0]


async def _dht_ping(dht: hivemind.DHT, node: Any, peer: str) -> None:
    """Runs in the DHT's process: ping ``peer``, which adds it to our routing table and us to its one."""
    await node.protocol.call_ping(PeerID.from_base58(peer))


async def _dht_clocks(dht: hivemind.DHT, node: Any, peers: list[str], limit: int,
                      timeout: float) -> list[tuple[float, float, float]]:
    """Runs in the DHT's process: ping ``peers`` (none given: up to ``limit`` distinct peers of its routing table,
    those nearest a random id; one peer can hold many of its entries, one per node id it made up) and note
    (sent, their time, received) for each that answered with its time."""
    from hivemind.dht.routing import DHTID
    from hivemind.proto import dht_pb2

    async def one(peer: PeerID) -> tuple[float, float, float] | None:
        try:
            sent = get_dht_time()
            answer = await node.protocol.get_stub(peer).rpc_ping(
                dht_pb2.PingRequest(peer=node.protocol.node_info, validate=False), timeout=timeout)
            received = get_dht_time()
        except Exception:  # a peer gone or silent: no sample
            return None
        return (sent, answer.dht_time, received) if answer.dht_time else None

    if peers:
        targets = list(dict.fromkeys(PeerID.from_base58(p) for p in peers))[:limit]
    else:
        near = node.protocol.routing_table.get_nearest_neighbors(DHTID.generate(), k=8 * limit, exclude=node.node_id)
        targets = list(dict.fromkeys(peer for _, peer in near))[:limit]
    return [s for s in await asyncio.gather(*(one(peer) for peer in targets)) if s is not None]


class TokenBucket:
    """Bytes-per-second limiter shared by all streams of one direction; burst is one second's worth."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self._tokens = rate or 0.0
        self._stamp = time.monotonic()

    async def consume(self, n: int) -> None:
        if not self.rate:
            return
        now = time.monotonic()
        self._tokens = min(self.rate, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= n
        if self._tokens < 0:
            await asyncio.sleep(-self._tokens / self.rate)


class BlobStore:
    """Named byte blobs this peer serves. A pinned blob is the round's work (this peer's own update and the
    updates it verified): it stays until ``drop`` removes it (the peer drops rounds past its catch-up window),
    so the store grows with the round instead of evicting the update every other peer fetches from it. The
    byte bound holds the other blobs (reports, evidence, copies served on), oldest evicted first."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._blobs: OrderedDict[str, bytes] = OrderedDict()
        self._pinned: set[str] = set()
        self._loose = 0  # bytes of the blobs that are not pinned
        self._lock = threading.Lock()
        self._updates = 0  # blobs held now that are updates ('u/...' names)
        self.peak_updates = 0  # the most updates held at once

    def put(self, name: str, data: bytes, *, pinned: bool = False) -> None:
        """Hold ``data`` as ``name`` (a blob pinned once stays pinned until dropped)."""
        with self._lock:
            pinned = pinned or name in self._pinned
            if name in self._blobs:
                self._remove(name)
            self._blobs[name] = data
            self._updates += name.startswith("u/")
            if pinned:
                self._pinned.add(name)
            else:
                self._loose += len(data)
            if self._loose > self.max_bytes:  # oldest first; never the one just put
                for old_name in [n for n in self._blobs if n not in self._pinned and n != name]:
                    self._remove(old_name)
                    if self._loose <= self.max_bytes:
                        break
            self.peak_updates = max(self.peak_updates, self._updates)

    def _remove(self, name: str) -> None:
        data = self._blobs.pop(name)
        self._updates -= name.startswith("u/")
        if name in self._pinned:
            self._pinned.discard(name)
        else:
            self._loose -= len(data)

    def get(self, name: str) -> bytes | None:
        with self._lock:
            return self._blobs.get(name)

    def drop(self, keep: Callable[[str], bool]) -> None:
        with self._lock:
            for name in [n for n in self._blobs if not keep(n)]:
                self._remove(name)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._blobs)


class StateStore:
    """The shared states this peer offers (node/swarm/statesync.py): per round, the chunks and the chunk list,
    by blob name. Kept apart from the BlobStore, whose bound they would fill (a 1B model's state is 4 GB and
    more) and whose updates they would evict. The two newest rounds' offers are served, so a joiner that read
    the previous manifest still completes its download."""

    KEPT = 2

    def __init__(self) -> None:
        self._offers: dict[int, dict[str, bytes]] = {}
        self._lock = threading.Lock()

    def offer(self, round_: int, blobs: dict[str, bytes]) -> None:
        """Serve ``blobs`` (name -> bytes) as round ``round_``'s offer; older offers past the newest KEPT end."""
        with self._lock:
            self._offers[round_] = blobs
            for r in sorted(self._offers)[:-self.KEPT]:
                del self._offers[r]

    def get(self, name: str) -> bytes | None:
        with self._lock:
            for blobs in self._offers.values():
                if name in blobs:
                    return blobs[name]
        return None

    def names(self) -> list[str]:
        with self._lock:
            return [n for blobs in self._offers.values() for n in blobs]


def _hivemind_key(identity: Identity) -> RSAPrivateKey:
    key = RSAPrivateKey.__new__(RSAPrivateKey)
    key._private_key = identity.private_key  # same key as the daemon: owner-protected subkeys
    return key


class _ManyKeys(RSASignatureValidator):
    """hivemind's owner check, with no record but under an owner's subkey, signing for several keys.

    Every record gradnode stores is one peer's, under its owner-protected subkey. hivemind's own check lets a
    record without a public key through (unprotected), and a plain value (no subkey) stored under a key with an
    expiration later than its subkeys' replaces them all on the node that takes it, which then refuses every
    subkey store under that key until it expires: one store, of any length of life the writer chose, emptied
    the run's member list or revocations on the nodes nearest the key. Every node refuses such records, as it
    stores them and as it reads them from others (hivemind validates both).

    Signing: each record with the subkey of one of ``more`` is signed with that key (by hivemind's own signer for
    it). One DHT node then writes the records of many identities (what the 'flood' and 'sybilvotes' attackers do:
    keys are free, a node per key is not needed); hivemind keeps one validator per node, so one holds them all."""

    def __init__(self, key: RSAPrivateKey, more: dict[str, RSAPrivateKey]) -> None:
        super().__init__(key)
        self.signers = {peer: RSASignatureValidator(k) for peer, k in more.items()}  # peer id -> its signer

    def validate(self, record: Any) -> bool:
        owned = record.subkey != DHTProtocol.IS_REGULAR_VALUE and self._PUBLIC_KEY_RE.search(record.subkey)
        return bool(owned) and super().validate(record)

    def sign_value(self, record: Any) -> bytes:
        for signer in (self, *self.signers.values()):
            if signer.local_public_key in record.key or signer.local_public_key in record.subkey:
                return RSASignatureValidator.sign_value(signer, record)
        return record.value


class RecordTraffic:
    """DHT records this peer read and wrote, by table (the key's kind: members, updates, reports, ...): how
    many values its reads returned and their bytes, how many it stored and their bytes. What the DHT process
    moves to answer them (its lookups, the copies of other nodes) is not counted here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_table: dict[str, list[int]] = {}  # table -> [reads, records read, record bytes read, writes, bytes]
        self.read_s = 0.0  # seconds the reads took, all together

    def _row(self, key: str) -> list[int]:
        parts = key.split("/")
        table = parts[2] if len(parts) > 2 else key
        return self.by_table.setdefault(table, [0, 0, 0, 0, 0])

    def read(self, key: str, records: int, size: int, seconds: float) -> None:
        with self._lock:
            self.read_s += seconds
            row = self._row(key)
            row[0] += 1
            row[1] += records
            row[2] += size

    def wrote(self, key: str, size: int) -> None:
        with self._lock:
            row = self._row(key)
            row[3] += 1
            row[4] += size

    def totals(self) -> dict[str, int]:
        with self._lock:
            rows = list(self.by_table.values())
        return {"reads": sum(r[0] for r in rows), "records_read": sum(r[1] for r in rows),
                "record_bytes_read": sum(r[2] for r in rows), "records_written": sum(r[3] for r in rows),
                "record_bytes_written": sum(r[4] for r in rows), "read_ms": round(1000 * self.read_s)}

    def records_read_by_table(self) -> dict[str, int]:
        return {t: row["records_read"] for t, row in self.tables().items()}

    def tables(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {t: dict(zip(("reads", "records_read", "record_bytes_read", "records_written",
                                 "record_bytes_written"), r)) for t, r in sorted(self.by_table.items())}


class Transport:
    """DHT records + stream-served blobs for one peer. ``signs_for``: more identities whose owner-protected
    records this node writes (``store(..., owner=)``; testing aid for the attackers with keys in bulk)."""

    def __init__(self, cfg: SwarmConfig, identity: Identity, *, blob_budget: int = 1 << 30,
                 upload_slots: int = 2, signs_for: Iterable[Identity] = ()) -> None:
        self.cfg = cfg
        self.identity = identity
        self.signs_for = list(signs_for)
        self.blobs = BlobStore(blob_budget)
        self.states = StateStore()
        self.bytes_up = 0
        self.bytes_down = 0
        self.state_bytes_down = 0  # of bytes_down, state chunks fetched (joining, re-syncing)
        self.upload_slots = upload_slots  # concurrent uploads per blob; more get 'busy' and go elsewhere
        self._serving: dict[str, int] = {}
        self._own_copies = CopyBudget(cfg.own_update_copies, copy_window_s(cfg.min_deadline_s))
        self._state_uploads = 0  # state chunks being uploaded now (bounded by cfg.state_upload_slots)
        self.state_bytes_up = 0  # of bytes_up, state chunks served to joiners
        self.own_update_bytes_up = 0  # of bytes_up, copies of this peer's own updates (served or pushed)
        self.busy_refusals = 0  # requests answered 'busy' (all upload slots of a blob or for state in use)
        self.quota_refusals = 0  # inbound streams refused unread: a peer over its stream or push quota
        self._inbound: dict[str, int] = {}  # peer -> inbound streams open now (swarm.max_streams_per_peer)
        self._pushes: dict[tuple[str, str], int] = {}  # (peer, round) -> pushes (swarm.pushes_per_round)
        self._slow: dict[str, float] = {}  # holder -> when a transfer from it last failed or crawled
        # accepts or refuses a pushed blob (name, bytes) -> bool; set by the peer, None refuses every push
        self.on_push: Callable[[str, bytes], bool] | None = None
        # whether a peer may open streams to us at all (a permissioned run: admitted members only); set by
        # the peer, read on the event loop, so it must not block
        self.admits: Callable[[str], bool] = lambda peer: True
        rate = cfg.bandwidth_bytes_per_s()
        self._up = TokenBucket(rate)
        self._down = TokenBucket(rate)
        self._dht: hivemind.DHT | None = None
        self._p2p: P2P | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gradnode-transport", daemon=True)
        self._dht_lock = threading.Lock()
        self._owners: dict[Any, str | None] = {}  # DHT subkey -> the peer id that owns it
        # key -> (when the read began, what it found): a read of the same key within READ_SHARE_S shares it;
        # (when a store of this peer under the key ended, None): reads begun before that are not kept
        self._reads: dict[str, tuple[float, list[tuple[str | None, bytes]] | None]] = {}
        self._reads_lock = threading.Lock()
        self.dht_reads = 0  # reads that went to the DHT
        self.records = RecordTraffic()  # what those reads returned and what this peer stored, by table
        self.reads_shared = 0  # DHT reads answered from a read of the same key less than READ_SHARE_S old
        self._closed = False
        self._sockdir: str | None = None
        self._maddrs: list[str] | None = None  # the addresses last visible (maddrs)
        self.blocked: frozenset[str] = frozenset()  # testing aid: peers of a simulated partition (see _watch_cut)

    def traffic(self) -> dict[str, Any]:
        """What this peer moved so far, as node/sim/traffic.py names it (one snapshot of its counters)."""
        t = self.records.totals()
        return {"update_bytes_down": self.bytes_down - self.state_bytes_down,
                "update_bytes_up": self.bytes_up - self.state_bytes_up, "records_read": t["records_read"],
                "records_written": t["records_written"], "record_bytes_read": t["record_bytes_read"],
                "tables": self.records.records_read_by_table()}

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self, timeout: float = 60.0, extra_peers: list[str] | None = None) -> None:
        """Start the DHT and the daemon, joining through swarm.initial_peers and ``extra_peers`` (the address
        book's; any one that answers will do). TransportError when none answers; with no configured
        initial peer (a bootstrap) the address book is a best effort, and the peer starts on its own."""
        try:
            self._start(timeout, [*self.cfg.initial_peers, *(extra_peers or [])])
        except TransportError:
            if self.cfg.initial_peers or not extra_peers:
                raise
            log.warning("nobody in the address book answered; starting without initial peers")
            # the daemon of that try listened on our port and exits on its own once it said so: the port comes
            # free a moment later (on a loaded machine the new daemon's check came first, and a restarted
            # bootstrap whose address book's peers were all gone stopped, 'the port is in use')
            self._start(timeout, [], port_wait_s=PORT_FREED_S)

    def _start(self, timeout: float, initial: list[str], port_wait_s: float = 0.0) -> None:
        key = _hivemind_key(self.identity)
        self._validator = _ManyKeys(key, {i.peer_id: _hivemind_key(i) for i in self.signs_for})
        # client mode (behind NAT): listen nowhere; streams only go out, updates are pushed to reachable peers
        hosts = [] if self.cfg.client_mode else list(self.cfg.host_maddrs)
        # the daemon's unix sockets go to a folder of our own in the temp folder (TMPDIR; hivemind's default
        # is /tmp itself), removed on close and after a failed start; `simulate` sets TMPDIR to one folder
        # per run, removed at its end, so that peers killed with -9 leave nothing behind either
        _check_ports_free(hosts, port_wait_s)  # the daemon would only say so after its whole startup timeout
        with socket_folder() as self._sockdir:
            try:
                self._dht = self._start_dht(initial, hosts, timeout)
            except Exception as err:  # the daemon's own words read like a local fault: say what to check
                shutil.rmtree(self._sockdir, ignore_errors=True)
                raise TransportError(explain_start_failure(err, initial, hosts),
                                     unanswered=_unanswered(str(err))) from err
            self._thread.start()
            self._p2p = self._run(self._dht.replicate_p2p(), timeout)
        if not self.cfg.client_mode:
            self._run(self._p2p.add_binary_stream_handler(_GET, self._serve), timeout)
            self._run(self._p2p.add_binary_stream_handler(_PUSH, self._receive_push), timeout)
        assert self.peer_id == self.identity.peer_id, "daemon and identity disagree on the peer id"
        if self.cfg.fault_partition_file is not None:
            threading.Thread(target=self._watch_cut, name="partition", daemon=True).start()
        log.info("transport up peer=%s maddrs=%s", self.peer_id, ",".join(self.maddrs()))

    def _start_dht(self, initial: list[str], hosts: list[str], timeout: float) -> Any:
        """hivemind's DHT process, ready. It is forked from this process, and a fork taken while another
        thread holds a lock (seen in a process that already runs a transport: the 'sybilvotes' attacker's
        extra identities) can leave the child blocked on that lock forever, and hivemind waits for it with no
        time limit (DHT(start=True) drops startup_timeout). So the wait is bounded: a child that neither came
        up nor failed (a silent initial peer fails it within ``timeout``) is killed with what it started,
        and forked once more."""
        tries = 2
        for attempt in range(1, tries + 1):
            dht = hivemind.DHT(
                initial_peers=initial or None, start=False,
                host_maddrs=hosts, announce_maddrs=list(self.cfg.announce_maddrs) or None,
                client_mode=self.cfg.client_mode, identity_path=str(self.identity.path),
                check_if_identity_free=self.cfg.identity_check,
                record_validators=[self._validator], startup_timeout=timeout)
            try:
                dht.run_in_background(await_ready=True, timeout=timeout + 10.0)
                return dht
            except (TimeoutError, concurrent.futures.TimeoutError):
                _kill_tree(dht.pid)
                dht.join(5.0)
                log.warning("the DHT process was neither up nor failed after %.0f s (try %d of %d)",
                            timeout + 10.0, attempt, tries)
        raise TimeoutError(f"the DHT process did not start in {tries} tries of {timeout + 10.0:.0f} s")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._dht is not None:
            try:
                self._dht.shutdown()
            except Exception as err:  # a dead DHT process is fine at shutdown
                log.debug("dht shutdown error=%r", err)
        if self._thread.is_alive():
            async def cancel_all() -> None:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            try:
                self._run(cancel_all(), 5)
            except Exception as err:
                log.debug("transport loop cleanup error=%r", err)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if self._sockdir is not None:
            shutil.rmtree(self._sockdir, ignore_errors=True)

    def _watch_cut(self) -> None:
        """Testing aid: re-read swarm.fault_partition_file every second; its peers are 'on the other side'."""
        path = self.cfg.fault_partition_file
        while not self._closed:
            try:
                import json

                self.blocked = frozenset(json.loads(path.read_text()).get("blocked", []))
            except (OSError, ValueError, AttributeError):
                pass  # not written yet, or being replaced
            time.sleep(1.0)

    @property
    def peer_id(self) -> str:
        assert self._dht is not None
        return self._dht.peer_id.to_base58()

    def maddrs(self) -> list[str]:
        """Addresses others can dial; none for a client-mode peer. Asked of the DHT process with a time limit
        (hivemind's own call waits for good on a DHT process that has exited): the last answer on failure."""
        assert self._dht is not None
        if self.cfg.client_mode:
            return []
        try:
            self._check_dht_alive()
            found = self._dht.run_coroutine(functools.partial(hivemind.DHT._get_visible_maddrs, latest=False),
                                            return_future=True).result(10.0)
            self._maddrs = [str(m) for m in found]
        except Exception as err:
            log.debug("visible maddrs failed: %r", err)
            if self._maddrs is None:
                raise
        return list(self._maddrs)

    def _run(self, coro, timeout: float):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _each(self, targets: list[tuple[str, list[str]]], call: Callable[[str, list[str]], Any], *, deadline: float,
              what: str, failed: Any = None) -> list[tuple[str, Any]]:
        """``await call(peer, addrs)`` for each target neither blocked nor this peer, all at once on the transport
        loop, each until ``deadline`` (time.monotonic(); 0.1 s at least, however late the loop starts it): [(peer,
        its result, or ``failed`` when it raised or ran out of time)]. An unreachable, vanished or refusing peer is
        a normal event: logged at debug level as ``what`` failed."""
        targets = [(p, a) for p, a in targets if p not in self.blocked and p != self.peer_id]

        async def one(peer: str, addrs: list[str]) -> Any:
            try:
                return await asyncio.wait_for(call(peer, addrs), max(0.1, deadline - time.monotonic()))
            except Exception as err:
                log.debug("%s failed peer=%s error=%r", what, peer[:12], err)
                return failed

        async def all_() -> list[Any]:
            return await asyncio.gather(*(one(p, a) for p, a in targets))

        if not targets:
            return []
        return list(zip((p for p, _ in targets), self._run(all_(), max(1.0, deadline - time.monotonic() + 5))))

    # --- DHT records -----------------------------------------------------------------------------------

    def now(self) -> float:
        return get_dht_time()

    def _check_dht_alive(self) -> None:
        """TransportError at once when the DHT process is gone (a signal to the process group ends it, and the
        libp2p daemon too): a call to it would wait out its whole timeout, and a stopping peer makes several."""
        assert self._dht is not None
        if not self._dht.is_alive():
            raise ConnectionError(f"the DHT process has exited (code {self._dht.exitcode})")

    def store(self, key: str, value: bytes, ttl: float, timeout: float = 10.0, owner: Identity | None = None) -> bool:
        """Store ``value`` under ``key`` in this peer's owner-protected subkey (or ``owner``'s, one of
        ``signs_for``); False on failure."""
        assert self._dht is not None
        assert len(value) <= _MAX_DHT_VALUE, f"DHT values must stay small, got {len(value)} bytes"
        assert owner is None or owner in self.signs_for, "this node signs for its own key and signs_for only"
        subkey = (self._validator if owner is None else self._validator.signers[owner.peer_id]).local_public_key
        t0 = time.monotonic()
        try:
            self._check_dht_alive()
            with self._dht_lock:
                fut = self._dht.store(key, value, self.now() + ttl, subkey=subkey, return_future=True)
            self.records.wrote(key, len(value))
            return bool(fut.result(timeout))
        except Exception as err:
            # closed meanwhile (the peer is ending): an expected failure, not news
            log.log(logging.DEBUG if self._closed else logging.WARNING, "dht store failed key=%s error=%r after %.1f s",
                    key, err, time.monotonic() - t0)
            return False
        finally:
            with self._reads_lock:  # no read begun before the store ended answers a read after it
                self._reads[key] = (time.monotonic(), None)
            if time.monotonic() - t0 > 2.0:  # unreachable DHT nodes (a split network) show up here first
                log.info("dht store slow key=%s seconds=%.1f", key, time.monotonic() - t0)

    def get(self, key: str, timeout: float = 10.0, fresh: bool = False) -> list[tuple[str | None, bytes]]:
        """All live values stored under ``key``, one per owner, each with the peer id that stored it (only
        its key can write that subkey); [] when none or on failure. A peer's threads poll the same keys (the
        agreement and the clock this round's, fetches their holders): a read less than READ_SHARE_S old
        answers them all, unless ``fresh`` (a DHT read costs milliseconds of CPU in every DHT process it asks;
        a 9-peer swarm: 15 % less CPU)."""
        assert self._dht is not None
        t0 = time.monotonic()
        with self._reads_lock:
            kept = self._reads.get(key)
            if not fresh and kept is not None and kept[1] is not None and t0 - kept[0] < READ_SHARE_S:
                self.reads_shared += 1
                return list(kept[1])
            self.dht_reads += 1
        found = self.read(key, timeout, t0)
        if found is not None:
            with self._reads_lock:
                if len(self._reads) >= 256:  # keys of past rounds (a read is given up after its timeout, 10 s)
                    self._reads = {k: v for k, v in self._reads.items() if t0 - v[0] < 30.0}
                if key not in self._reads or self._reads[key][0] < t0:
                    self._reads[key] = (t0, found)
        return list(found or [])

    def read(self, key: str, timeout: float = 10.0, t0: float | None = None) -> list[tuple[str | None, bytes]] | None:
        """One DHT read of ``key``, never shared: as ``get``, but None on failure (for a caller that must tell a
        failed read from no record, such as one that rewrites the record from what it read)."""
        found = self.read_expiring(key, timeout, t0)
        return None if found is None else [(owner, value) for owner, value, _ in found]

    def read_expiring(self, key: str, timeout: float = 10.0,
                      t0: float | None = None) -> list[tuple[str | None, bytes, float]] | None:
        """``read``, each value with its expiration (DHT time): a store under one's own subkey is refused unless
        it expires later than the value there (hivemind keeps the later of the two)."""
        t0 = time.monotonic() if t0 is None else t0
        try:
            self._check_dht_alive()
            with self._dht_lock:
                fut = self._dht.get(key, latest=True, return_future=True)
            found = fut.result(timeout)
        except Exception as err:
            log.log(logging.DEBUG if self._closed else logging.WARNING, "dht get failed key=%s error=%r after %.1f s",
                    key, err, time.monotonic() - t0)
            return None
        if time.monotonic() - t0 > 2.0:  # unreachable DHT nodes (a split network) show up here first
            log.info("dht get slow key=%s seconds=%.1f", key, time.monotonic() - t0)
        if found is None or not isinstance(found.value, dict):
            return []
        out = [(self._owner(subkey), v.value, v.expiration_time) for subkey, v in found.value.items()
               if isinstance(v.value, bytes)]
        self.records.read(key, len(out), sum(len(v) for _, v, _ in out), time.monotonic() - t0)
        return out

    def _owner(self, subkey: Any) -> str | None:
        if subkey not in self._owners:
            if len(self._owners) >= 4096:
                self._owners.clear()
            self._owners[subkey] = peer_id_from_dht_owner(subkey)
        return self._owners[subkey]

    # --- blobs over streams ----------------------------------------------------------------------------

    def _take_slot(self, peer: str) -> bool:
        """One more inbound stream from ``peer``, within swarm.max_streams_per_peer (free with _free_slot)."""
        if self._inbound.get(peer, 0) >= self.cfg.max_streams_per_peer:
            self.quota_refusals += 1
            return False
        self._inbound[peer] = self._inbound.get(peer, 0) + 1
        return True

    def _free_slot(self, peer: str) -> None:
        left = self._inbound.get(peer, 1) - 1
        if left:
            self._inbound[peer] = left
        else:
            self._inbound.pop(peer, None)

    async def _serve(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = info.peer_id.to_base58()
        if peer in self.blocked or not self.admits(peer) or not self._take_slot(peer):
            writer.close()
            return
        try:
            await self._serve_one(info, reader, writer)
        finally:
            self._free_slot(peer)

    async def _serve_one(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            name = await _read_name(reader)
            data = None if not isinstance(name, str) else self.states.get(name) if name.startswith("s/") else \
                self.blobs.get(name)
            is_state = data is not None and name.startswith("s/")
            own = data is not None and update_sender(name) == self.peer_id
            busy = data is not None and (self._serving.get(name, 0) >= self.upload_slots or
                                         (is_state and self._state_uploads >= self.cfg.state_upload_slots) or
                                         (own and self._own_copies_spent(name)))
            self.busy_refusals += busy
            if data is None or busy:
                writer.write(_HEADER.pack(0 if data is None else 2, 0))
                await writer.drain()
                return
            self._serving[name] = self._serving.get(name, 0) + 1
            self._state_uploads += is_state
            try:
                writer.write(_HEADER.pack(1, len(data)))
                await self._send(writer, data, is_state=is_state, own=own)
            finally:
                self._serving[name] -= 1
                self._state_uploads -= is_state
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ValueError) as err:
            log.debug("serve aborted peer=%s error=%r", info.peer_id, err)
        finally:
            writer.close()

    def _own_copies_spent(self, name: str) -> bool:
        """Gossip for our own updates (CopyBudget); blobs no longer held are forgotten."""
        if len(self._own_copies.windows) > 256:
            self._own_copies.forget(lambda n: self.blobs.get(n) is None)
        return not self._own_copies.take(name, time.monotonic())

    async def _send(self, writer: asyncio.StreamWriter, data: bytes, *, is_state: bool = False,
                    own: bool = False) -> None:
        """Write ``data`` in pieces paced by the upload token bucket, counting bytes as they go (also apart:
        state chunks, and copies of our own updates, which the gossip cap bounds)."""
        slow = self.cfg.fault == "slowhold"  # testing aid: an adversary that trickles what it serves
        step = 64 if slow else _CHUNK
        for i in range(0, len(data), step):
            piece = data[i:i + step]
            if slow:
                await asyncio.sleep(len(piece) / SLOWHOLD_BYTES_PER_S)
            await self._up.consume(len(piece))
            writer.write(piece)
            await asyncio.wait_for(writer.drain(), _STALL_S)  # a reader that stops reading is dropped
            self.bytes_up += len(piece)
            self.state_bytes_up += len(piece) if is_state else 0
            self.own_update_bytes_up += len(piece) if own else 0

    async def _open(self, peer: str, addrs: Iterable[str], handler: str, name: str,
                    extra: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Open a ``handler`` stream to ``peer`` (dialling ``addrs`` if the daemon knows no route yet) and
        send the request header: the blob name, length-prefixed, then ``extra``."""
        assert self._p2p is not None
        pid = PeerID.from_base58(peer)
        try:
            _, reader, writer = await asyncio.wait_for(self._p2p.call_binary_stream_handler(pid, handler), _OPEN_S)
        except Exception:
            maddrs = [Multiaddr(_without_peer_id(a)) for a in addrs]
            if not maddrs:
                raise
            await asyncio.wait_for(self._p2p._client.connect(pid, maddrs), _OPEN_S)
            _, reader, writer = await asyncio.wait_for(self._p2p.call_binary_stream_handler(pid, handler), _OPEN_S)
        req = msgpack.packb(name)
        writer.write(struct.pack(">I", len(req)) + req + extra)
        return reader, writer

    async def _fetch(self, peer: str, name: str, max_bytes: int, addrs: Iterable[str], *,
                     busy_raises: bool = False) -> bytes | None:
        """Blob ``name`` from ``peer``; None when it holds none, or is busy serving it (``busy_raises``: Busy)."""
        reader, writer = await self._open(peer, addrs, _GET, name)
        try:
            await asyncio.wait_for(writer.drain(), _STALL_S)
            status, length = _HEADER.unpack(await asyncio.wait_for(reader.readexactly(_HEADER.size), _STALL_S))
            if status == 2 and busy_raises:
                raise Busy(f"{peer[:12]} is busy serving {name}")
            if status != 1:
                return None
            if length > max_bytes:
                raise ValueError(f"blob {name} of {length} bytes exceeds the cap {max_bytes}")
            body = await self._read_body(reader, length, peer)
            self.state_bytes_down += length if name.startswith("s/") else 0
            return body
        finally:
            writer.close()

    async def _read_body(self, reader: asyncio.StreamReader, length: int, peer: str) -> bytes:
        """``length`` bytes from ``peer``, in pieces paced by the download bucket. Each piece must come within
        _STALL_S and, with swarm.min_stream_bytes_per_s, while the transfer keeps that rate after its first
        second: a peer that stalls or trickles is dropped (TimeoutError) and marked slow for a minute."""
        parts, left = [], length
        t0, floor = time.monotonic(), self.cfg.min_stream_bytes_per_s
        while left:
            size = min(_CHUNK, left)
            by = _STALL_S if not floor else 1.0 + (length - left + size) / floor - (time.monotonic() - t0)
            try:
                piece = await asyncio.wait_for(reader.readexactly(size), max(0.05, min(_STALL_S, by)))
            except asyncio.TimeoutError:
                self._slow[peer] = time.monotonic()
                raise
            await self._down.consume(len(piece))
            self.bytes_down += len(piece)
            parts.append(piece)
            left -= len(piece)
        return b"".join(parts)

    def fetch(self, sources: Sources, name: str, *, max_bytes: int, deadline: float,
              verify: Callable[[bytes], bool] = lambda _: True) -> bytes | None:
        """Fetch blob ``name`` from any of ``sources`` [(peer id, maddrs)], trying them in a random order
        (spreads the load among holders) and retrying until ``deadline`` (time.monotonic()).
        Returns the first copy that ``verify`` accepts, or None."""
        return self._run(self.fetch_async(sources, name, max_bytes=max_bytes, deadline=deadline, verify=verify),
                         max(1.0, deadline - time.monotonic() + 5))

    async def fetch_async(self, sources: Sources, name: str, *, max_bytes: int, deadline: float,
                          verify: Callable[[bytes], bool] = lambda _: True,
                          stop: threading.Event | None = None) -> bytes | None:
        """Try holders in a random order (a callable ``sources`` is re-read every pass: new holders join
        the pool as the blob spreads); back off between passes; give up at ``deadline``, or once ``stop`` is set
        (before the next holder is asked: the peer is leaving, and a supervisor kills it 10 s after its SIGTERM;
        a re-sync retrying unreachable donors until its 30 s deadline was killed so). A holder whose bytes
        failed ``verify`` is not asked for this blob again: it lied or holds a broken copy, and asking it
        every pass kept a fetch from one such holder busy to its deadline (a witness serving a report that
        is not its own held an asking peer up for the whole wait)."""
        me = self.peer_id
        passes = 0
        refused: set[str] = set()  # holders whose bytes for this name failed verify
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            local = self.blobs.get(name)  # pushed to us, or fetched by another task meanwhile
            if local is not None and len(local) <= max_bytes and verify(local):
                return local
            # a callable reads the DHT (the exchange's holders): in a thread, never on this event loop, which
            # serves every stream of this peer (a DHT read can take seconds when nodes are out of reach)
            listed = await asyncio.to_thread(sources) if callable(sources) else sources
            order = [s for s in listed if s[0] != me and s[0] not in self.blocked and s[0] not in refused]
            if refused and not callable(sources) and all(s[0] in refused or s[0] == me for s in listed):
                return None  # every holder named served bytes that failed: nobody left to ask
            random.shuffle(order)
            # an update's own sender last: it serves a few copies, the rest spreads from those (gossip); holders
            # that crawled or failed within the last minute after everyone else
            origin, now = update_sender(name), time.monotonic()
            slow = {p for p, t in self._slow.items() if now - t < 60.0} if self.cfg.min_stream_bytes_per_s else set()
            order.sort(key=lambda s: (s[0] in slow, s[0] == origin))
            for peer, addrs in order:
                left = deadline - time.monotonic()
                if left <= 0 or (stop is not None and stop.is_set()):
                    return None
                try:
                    data = await asyncio.wait_for(self._fetch(peer, name, max_bytes, addrs), left)
                    if data is not None and verify(data):
                        return data
                    if data is not None:
                        refused.add(peer)
                        log.warning("fetched blob rejected name=%s from=%s", name, peer)
                except Exception as err:  # lost connections and timeouts are normal events
                    log.debug("fetch failed name=%s from=%s error=%r", name, peer, err)
                    if len(self._slow) > 1024:
                        self._slow.clear()
                    self._slow[peer] = time.monotonic()  # tried last for a minute
            passes += 1
            await asyncio.sleep(min(0.05 * passes, 0.5, max(0.0, deadline - time.monotonic())))
        return None

    async def _receive_push(self, info, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A client-mode peer hands us a blob: read it (bounded), let ``on_push`` verify it, answer 1/0."""
        ok = False
        peer = info.peer_id.to_base58()
        if peer in self.blocked or not self.admits(peer) or not self._take_slot(peer):
            writer.close()
            return
        try:
            name = await _read_name(reader)
            (length,) = struct.unpack(">Q", await asyncio.wait_for(reader.readexactly(8), _STALL_S))
            if not isinstance(name, str) or length > self.cfg.max_update_bytes or self.on_push is None \
                    or not self._push_allowed(peer, name):
                return
            data = await self._read_body(reader, length, peer)
            # verification decodes and checks a signature: off the event loop
            ok = await asyncio.get_running_loop().run_in_executor(None, self.on_push, name, data)
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ValueError) as err:
            log.debug("push aborted peer=%s error=%r", info.peer_id, err)
        finally:
            try:
                writer.write(bytes([1 if ok else 0]))
                await writer.drain()
            except (ConnectionError, RuntimeError):
                pass
            writer.close()
            self._free_slot(peer)

    def _push_allowed(self, peer: str, name: str) -> bool:
        """A peer pushes only its own update (u/<run>/<round>/<itself>), at most swarm.pushes_per_round times."""
        parts = name.split("/")
        if len(parts) != 4 or update_sender(name) != peer:
            self.quota_refusals += 1
            return False
        if len(self._pushes) > 4096:  # old rounds: forget them
            self._pushes.clear()
        key = (peer, parts[2])
        self._pushes[key] = self._pushes.get(key, 0) + 1
        if self._pushes[key] > self.cfg.pushes_per_round:
            self.quota_refusals += 1
            return False
        return True

    async def push_async(self, peer: str, addrs: Iterable[str], name: str, data: bytes) -> bool:
        """Hand blob ``name`` to ``peer`` (which verifies, holds and serves it); True when it accepted."""
        reader, writer = await self._open(peer, addrs, _PUSH, name, struct.pack(">Q", len(data)))
        try:
            await self._send(writer, data, own=True)
            return (await asyncio.wait_for(reader.readexactly(1), 60)) == b"\x01"
        finally:
            writer.close()

    def push(self, targets: list[tuple[str, list[str]]], name: str, data: bytes, *, deadline: float) -> int:
        """Push a blob to every target concurrently (bounded by ``deadline``); returns how many accepted."""
        pushed = self._each(targets, lambda peer, addrs: self.push_async(peer, addrs, name, data),
                            deadline=deadline, what=f"push {name}", failed=False)
        return sum(ok for _, ok in pushed)

    def dial(self, targets: list[tuple[str, list[str]]], timeout: float = 5.0) -> dict[str, bool]:
        """Connect to each (peer id, maddrs) and ping it through the DHT, so that both add each other to
        their routing tables (a peer found in the address book joins this peer's DHT again). Concurrent,
        bounded by ``timeout``; {peer id: answered}."""
        async def connect(peer: str, maddrs: list[str]) -> bool:
            addrs = [Multiaddr(_without_peer_id(m)) for m in maddrs]
            await self._p2p._client.connect(PeerID.from_base58(peer), addrs)
            return True

        if self._dht is None:
            return {}
        answered = dict(self._each(targets, connect, deadline=time.monotonic() + timeout, what="dial", failed=False))
        for peer, ok in answered.items():
            if ok and self._dht.is_alive():  # in the DHT's process: its routing table and the other's learn each other
                self._dht.run_coroutine(functools.partial(_dht_ping, peer=peer), return_future=True)
        return answered

    def clock_samples(self, peers: Iterable[str] = (), limit: int = 5, timeout: float = 5.0) -> list[Sample]:
        """Ping up to ``limit`` of ``peers`` (peer ids; none given: distinct peers this peer's DHT knows, whether
        their records are in sight or not) for their clocks, one sample per peer (protocol/skew.py); [] when none
        answers. Blocks up to ``timeout`` + 5 s: call it off the threads that keep time."""
        if self._dht is None or self._closed:
            return []
        try:
            found = self._dht.run_coroutine(functools.partial(_dht_clocks, peers=list(peers), limit=limit,
                                                              timeout=timeout),
                                            return_future=True).result(timeout + 5.0)
        except Exception as err:  # a DHT hiccup: no samples this time
            log.debug("clock samples failed: %r", err)
            return []
        return [Sample(*s) for s in found]

    def submit(self, coro) -> "concurrent.futures.Future":
        """Run a coroutine on the transport loop without waiting (fetches in the background)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def ask_each(self, sources: list[tuple[str, list[str]]], name: str, *, max_bytes: int,
                 timeout: float) -> tuple[dict[str, bytes | None], bool]:
        """Ask each of ``sources`` (neither blocked nor this peer) once, all at once, for blob ``name``: {peer: its
        bytes, or None when it answered that it holds none}, and whether every peer asked answered; one that fails,
        is busy serving the blob or does not answer within ``timeout`` is left out (that says nothing of what it
        holds). For a look at what each holds (a kept list of the run's end), not a blob any one copy of will do
        (``fetch`` retries holders until one serves it)."""
        silent = object()
        asked = self._each(sources, lambda peer, addrs: self._fetch(peer, name, max_bytes, addrs, busy_raises=True),
                           deadline=time.monotonic() + timeout, what=f"ask {name}", failed=silent)
        answers = {peer: got for peer, got in asked if got is not silent}
        return answers, len(answers) == len(asked)

    def fetch_many(self, jobs: list[tuple[list[tuple[str, list[str]]], str]], *, max_bytes: int, deadline: float,
                   verify: Callable[[str, bytes], bool], stop: threading.Event | None = None) -> dict[str, bytes]:
        """Fetch several blobs concurrently; returns {name: bytes} for those that arrived and verified (``stop``:
        fetch_async's)."""
        if not jobs:
            return {}
        return self._run(self.fetch_many_async(jobs, max_bytes=max_bytes, deadline=deadline, verify=verify, stop=stop),
                         max(1.0, deadline - time.monotonic() + 5))

    async def fetch_many_async(self, jobs: list[tuple[list[tuple[str, list[str]]], str]], *, max_bytes: int,
                               deadline: float, verify: Callable[[str, bytes], bool],
                               stop: threading.Event | None = None) -> dict[str, bytes]:
        """``fetch_many`` as a coroutine, for a caller that goes on meanwhile (``submit``)."""
        async def one(sources, name):
            data = await self.fetch_async(sources, name, max_bytes=max_bytes, deadline=deadline,
                                          verify=lambda d: verify(name, d), stop=stop)
            return name, data

        results = await asyncio.gather(*(one(s, n) for s, n in jobs))
        return {n: d for n, d in results if d is not None}


async def _read_name(reader: asyncio.StreamReader) -> Any:
    """The length-prefixed msgpack name every inbound stream opens with; ValueError past _MAX_REQUEST bytes."""
    (n,) = struct.unpack(">I", await asyncio.wait_for(reader.readexactly(4), _STALL_S))
    if n > _MAX_REQUEST:
        raise ValueError(f"request name of {n} bytes")
    return msgpack.unpackb(await asyncio.wait_for(reader.readexactly(n), _STALL_S))


def _kill_tree(pid: int | None) -> None:
    """SIGKILL ``pid`` and every process below it (the DHT process's libp2p daemon), children first."""
    import os
    import signal

    if pid is None:
        return
    try:
        kids = open(f"/proc/{pid}/task/{pid}/children").read().split()
    except OSError:  # gone already, or no /proc (not Linux): the process alone
        kids = []
    for kid in kids:
        _kill_tree(int(kid))
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass

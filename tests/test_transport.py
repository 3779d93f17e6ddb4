"""Two real transports (hivemind DHT + libp2p daemon each) in this process, on 127.0.0.1."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import threading
import time
from pathlib import Path

import pytest

from conftest import settles
from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import transport
from gradnode.node.swarm.identity import load_or_create
from gradnode.node.swarm.transport import Transport, TransportError
from gradnode.protocol.records import dht_key, update_name
from gradnode.protocol import skew

pytestmark = pytest.mark.swarm


def test_records_blobs_gossip_and_counters(trio, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = trio
    assert a.store("k", b"from-a", ttl=30) and b.store("k", b"from-b", ttl=30)
    # one value per owner, none overwritten, each with the peer id whose key alone can write it
    assert sorted(c.get("k"), key=lambda kv: kv[1]) == [(a.peer_id, b"from-a"), (b.peer_id, b"from-b")]

    # a read younger than READ_SHARE_S answers the peer's other reads of the key (its threads poll the same
    # keys); a store of its own under the key is seen by its next read (here the time is stretched: no schedule
    # can make the second read come later than the window)
    monkeypatch.setattr(transport, "READ_SHARE_S", 3600.0)
    reads = c.dht_reads
    assert c.get("k2") == [] and (c.dht_reads, c.reads_shared) == (reads + 1, 0)
    assert b.store("k2", b"from-b", ttl=30)
    assert c.get("k2") == [] and (c.dht_reads, c.reads_shared) == (reads + 1, 1)  # the read before's answer
    assert c.store("k2", b"from-c", ttl=30)
    assert sorted(v for _, v in c.get("k2")) == [b"from-b", b"from-c"] and c.dht_reads == reads + 2
    monkeypatch.setattr(transport, "READ_SHARE_S", 0.0)
    assert len(c.get("k2")) == 2 and (c.dht_reads, c.reads_shared) == (reads + 3, 1)

    blob = bytes(range(256)) * 4000
    a.blobs.put("u/x", blob)
    got = b.fetch([(a.peer_id, a.maddrs())], "u/x", max_bytes=10**7, deadline=time.monotonic() + 60)
    assert got == blob and b.bytes_down == len(blob)
    # the server counts a piece once its write drained, which can be just after the fetcher has it all
    assert settles(lambda: a.bytes_up == len(blob)), a.bytes_up
    b.blobs.put("u/x", got)
    # c fetches from b only: a fetched blob is served again (gossip)
    got_c = c.fetch([(b.peer_id, b.maddrs())], "u/x", max_bytes=10**7, deadline=time.monotonic() + 60,
                    verify=lambda d: hashlib.sha256(d).digest() == hashlib.sha256(blob).digest())
    assert got_c == blob and settles(lambda: b.bytes_up == len(blob)), b.bytes_up


def test_a_value_no_key_owns_is_refused_and_blinds_no_key(trio) -> None:
    """c stores as modified code would, with hivemind's own store: a plain value (no subkey) and a value under a
    subkey no key owns, both living ten years. Every node refuses them, so the owners' records under the key are
    stored and read as before. Before, the nodes took the plain value: it replaced every record under the key,
    and each node refused every owner's store after it (a's store failed: one store emptied the member list)."""
    from hivemind.utils import get_dht_time

    a, b, c = trio
    key = "gradnode/run/members"
    assert settles(lambda: a.store(key, b"before", ttl=30))
    far = get_dht_time() + 10 * 365 * 86400.0
    with c._dht_lock:
        c._dht.store(key, b"junk", far)
        c._dht.store(key, b"junk", far, subkey="nobody")
    # a loaded machine can fail one store or read (a timeout): tried again, as the node does; refused, never stored
    assert settles(lambda: a.store(key, b"from-a", ttl=30))
    assert settles(lambda: b.read(key) == [(a.peer_id, b"from-a")])


def test_one_node_writes_the_records_of_keys_in_bulk_each_under_its_own_key(trio, tmp_path: Path) -> None:
    """The attackers with keys in bulk ('flood', 'sybilvotes') write every key's records through one DHT node:
    each record lands in its key's owner-protected subkey, signed by that key, and the readers name that key
    as its owner (as they would for a node per key); a key the node does not hold it cannot write for."""
    from gradnode.node.swarm.adversary import _SignedAs
    from gradnode.node.swarm.membership import Membership

    a, _, c = trio
    keys = [load_or_create(tmp_path / f"k{i}") for i in range(3)]
    node = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=a.maddrs()),
                     load_or_create(tmp_path / "node"), signs_for=keys)
    try:
        node.start()
        for k in keys:
            m = Membership(_SignedAs(node, k), k, "run", ttl=30.0)
            assert m.publish(round_=1, training=True, step_seconds=1.0, inner_steps=4, tokens_per_s=1.0, rejected=0,
                             loss=None)
        assert node.store("k", b"own", ttl=30)
        seen = Membership(c, c.identity, "run", ttl=30.0).members(max_age=0)
        assert {k.peer_id for k in keys} <= set(seen) and node.peer_id not in seen  # only the keys published
        assert (node.peer_id, b"own") in c.get("k")
        with pytest.raises(AssertionError):
            node.store("k", b"x", ttl=30, owner=a.identity)
    finally:
        node.close()


def test_a_replayed_leaving_record_does_not_make_a_peer_leave(trio, monkeypatch: pytest.MonkeyPatch) -> None:
    """replayleave: peer b keeps a copy of a's signed 'leaving' record (a left, then came back) and stores it
    under its own key. The signature is a's, so without the owner check c takes a for gone (nobody would
    wait for its proposal); with it, c sees a as a live member and counts b's record as bad."""
    from gradnode.node.swarm.membership import Membership

    monkeypatch.setattr(transport, "READ_SHARE_S", 0.0)  # each read of c begins after the others' stores before it
    a, b, c = trio
    ma, mc = (Membership(t, t.identity, "run", ttl=30.0) for t in (a, c))
    common = dict(round_=3, training=True, step_seconds=1.0, inner_steps=10, tokens_per_s=1.0, rejected=0, loss=None)
    assert ma.publish(leaving=True, **common)
    assert mc.leaving() == {a.peer_id}  # a's own departure counts
    old = next(raw for owner, raw in c.get(dht_key("run", "members")) if owner == a.peer_id)
    assert ma.publish(**common)  # a is back: its own subkey now says so
    assert b.store(dht_key("run", "members"), old, ttl=30)  # the replay, under b's key
    assert a.peer_id in mc.members(max_age=0) and mc.leaving() == set()
    assert mc.bad_records.get(b.peer_id, 0) >= 1


def test_under_a_committee_a_record_not_listed_is_read_from_its_writers_own_key(trio, monkeypatch) -> None:
    """Committee runs: a key that is not listed (protocol/roster.py) writes its member record under its own
    key only. Its records still verify at a reader, and its addresses are found, from that key; a record that
    another key stores under it names another writer and is dropped. A listed one is in the member table too,
    and a departure always is."""
    from gradnode.node.swarm.membership import Membership
    from gradnode.protocol.records import WeightHash, member_key

    monkeypatch.setattr(transport, "READ_SHARE_S", 0.0)
    a, b, c = trio
    ma, mb, mc = (Membership(t, t.identity, "run", ttl=30.0) for t in trio)
    for m in (ma, mb, mc):
        m.own_key = True
    ma.listed = lambda: False
    common = dict(round_=3, training=True, step_seconds=1.0, inner_steps=10, tokens_per_s=1.0, rejected=0, loss=None)
    assert ma.publish(**common) and mb.publish(**common)
    assert set(mc.members(max_age=0)) == {b.peer_id}  # a is not in the member table
    forged = next(raw for owner, raw in c.get(member_key("run", b.peer_id)) if owner == b.peer_id)
    assert b.store(member_key("run", a.peer_id), forged, ttl=30)  # b's record under a's key
    assert mc.public_key(a.peer_id) == a.identity.public_der  # from a's own key, its own subkey only
    assert mc.sources([a.peer_id]) == [(a.peer_id, list(a.maddrs()[:16]))]
    assert ma.write("weights", 3, WeightHash(run_id="run", round=3, peer=a.peer_id, param_hash="ab" * 8))
    assert [w.peer for w in mc.read("weights", 3, WeightHash)] == [a.peer_id]
    assert ma.publish(leaving=True, **common)
    mc.members(max_age=0)
    assert mc.leaving() == {a.peer_id}  # a departure is listed
    assert mc.bad_records.get(b.peer_id, 0) == 0  # b's copy under a's key was skipped unread, not counted


def test_a_peer_gets_a_bounded_number_of_streams_and_pushes(trio, monkeypatch) -> None:
    """Streams held open without reading, and pushes beyond the quota or of another peer's update, are
    refused at once (swarm.max_streams_per_peer, swarm.pushes_per_round), and counted."""
    import asyncio

    from gradnode.node.swarm import transport as tr

    a, b, c = trio
    # a reader that stops reading is dropped after _STALL_S: on a busy machine the fourth stream could open after
    # the first was dropped, and take its slot; here the streams stay until b closes them
    monkeypatch.setattr(tr, "_STALL_S", 600.0)
    for i in range(5):  # one blob per stream: a blob has its own upload slots (2)
        a.blobs.put(f"big{i}", bytes(4 << 20))

    async def hold(n: int) -> list[int]:
        statuses, writers = [], []
        for i in range(n):
            reader, writer = await b._open(a.peer_id, a.maddrs(), tr._GET, f"big{i}")
            writers.append(writer)
            try:
                statuses.append(tr._HEADER.unpack(await asyncio.wait_for(reader.readexactly(tr._HEADER.size), 60))[0])
            except (asyncio.IncompleteReadError, ConnectionError):
                statuses.append(-1)  # closed unread
        for w in writers:
            w.close()
        return statuses

    a.cfg.max_streams_per_peer = 1024  # no quota: b holds 5 streams (and 5 x 4 MB of a's send buffers) at will
    assert b._run(hold(5), 180) == [1] * 5
    end = time.monotonic() + 60
    while a._inbound.get(b.peer_id) and time.monotonic() < end:  # a sees them closed (soon, or on a busy machine later)
        time.sleep(0.1)
    assert not a._inbound.get(b.peer_id), a._inbound
    a.cfg.max_streams_per_peer = 3
    assert b._run(hold(5), 180) == [1, 1, 1, -1, -1] and a.quota_refusals == 2
    # the streams closed, the slots are free again, for b and for anyone else
    assert c.fetch([(a.peer_id, a.maddrs())], "big0", max_bytes=5 << 20, deadline=time.monotonic() + 60) is not None

    a.on_push = lambda name, data: True  # accepts anything that reaches it
    others = f"u/run/5/{c.peer_id}"
    assert b.push([(a.peer_id, a.maddrs())], others, b"x" * 100, deadline=time.monotonic() + 60) == 0
    own = f"u/run/5/{b.peer_id}"
    got = [b.push([(a.peer_id, a.maddrs())], own, b"x" * 100, deadline=time.monotonic() + 60) for _ in range(4)]
    assert got == [1, 1, 1, 0] and a.quota_refusals == 4


def test_a_trickling_holder_costs_a_second_once_not_a_deadline(trio, monkeypatch) -> None:
    """slowhold, at the stream level: a holder serving 128 bytes/s. Without a floor on the rate, fetching a
    1 KB update from it takes 8 s (a round's deadline, several times over); with 16 KB/s after a first
    second, the transfer is dropped after about 1 s, and the holder is tried last from then on."""
    import os

    from gradnode.node.swarm import transport as tr

    a, b, c = trio
    # the body comes in one read of 64 bytes every 0.5 s (8 s) that a stall ends after _STALL_S (10 s): too close on a
    # loaded machine, where each piece can come late
    monkeypatch.setattr(tr, "_STALL_S", 60.0)
    blob = os.urandom(1024)
    for t in (a, c):
        t.blobs.put("u/run/1/x", blob)
    a.cfg.fault = "slowhold"
    b.cfg.min_stream_bytes_per_s = 0
    t0 = time.monotonic()
    assert b.fetch([(a.peer_id, a.maddrs())], "u/run/1/x", max_bytes=1 << 20, deadline=t0 + 60) == blob
    assert time.monotonic() - t0 > 6.0
    b.cfg.min_stream_bytes_per_s = 16384
    t0 = time.monotonic()
    assert b.fetch([(a.peer_id, a.maddrs())], "u/run/1/x", max_bytes=1 << 20, deadline=t0 + 15) is None  # the floor (without it: the blob, in ~8 s)
    served = c.bytes_up
    for _ in range(5):  # both hold it; the slow one goes last, whatever the shuffle: c serves all five
        assert b.fetch([(a.peer_id, a.maddrs()), (c.peer_id, c.maddrs())], "u/run/1/x", max_bytes=1 << 20,
                       deadline=time.monotonic() + 60) == blob
    assert settles(lambda: c.bytes_up - served >= 5 * len(blob)), (c.bytes_up, served)


def test_missing_oversized_and_dead_sources_return_none(trio) -> None:
    a, b, _ = trio
    a.blobs.put("big", b"x" * 5000)
    assert b.fetch([(a.peer_id, [])], "nope", max_bytes=10**6, deadline=time.monotonic() + 1.5) is None
    assert b.fetch([(a.peer_id, [])], "big", max_bytes=100, deadline=time.monotonic() + 1.5) is None
    dead = "QmYzqWF8yvd4ihZ6sMsf9zDEeoHEbNEKdDi7vvEEE7CebL"
    assert b.fetch([(dead, ["/ip4/127.0.0.1/tcp/9/p2p/" + dead])], "big", max_bytes=10**6,
                   deadline=time.monotonic() + 2) is None  # bounded by the deadlines (a hang: pytest-timeout)


def test_a_fetch_ends_once_the_peer_stops_not_at_its_deadline(trio) -> None:
    """A peer that is leaving (SIGTERM: Peer.stop) ends a download in progress before asking the next holder: a
    straggler re-syncing when its SIGTERM came retried a holder for its 30 s deadline, and the supervisor killed it
    10 s after the signal, without its checkpoint. A holder without the blob is asked again every pass until the
    deadline (400 s here, pytest-timeout at 600 s); with stop set half a second in, the fetch ends long before."""
    a, b, _ = trio
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    t0 = time.monotonic()
    got = b.fetch_many([([(a.peer_id, a.maddrs())], "nope")], max_bytes=10**6, deadline=t0 + 400,
                       verify=lambda name, data: True, stop=stop)
    assert got == {} and time.monotonic() - t0 < 200


def test_token_bucket_caps_the_link(tmp_path: Path) -> None:
    made = []
    try:
        a = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], bandwidth="8mbit"),
                      load_or_create(tmp_path / "a"))
        made.append(a)
        a.start()
        b = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=a.maddrs()),
                      load_or_create(tmp_path / "b"))
        made.append(b)
        b.start()
        a.blobs.put("blob", b"y" * 3_000_000)
        t0 = time.monotonic()
        assert b.fetch([(a.peer_id, a.maddrs())], "blob", max_bytes=10**7, deadline=t0 + 30) is not None
        assert time.monotonic() - t0 >= 1.5  # 3 MB at 1 MB/s with a one-second burst
    finally:
        for t in made:
            t.close()


def test_a_holder_serving_bytes_that_fail_verification_is_asked_once(trio) -> None:
    """A holder that serves bytes that fail the check (a lie, or a broken copy) is not asked for that blob
    again. Before, it was asked every pass until the deadline: one witness serving a report that was not its
    own held an asking peer for the whole wait (test_agreement's 30 s). Counted in bytes fetched, not seconds:
    one copy of the bad bytes, whatever the scheduling."""
    import os

    a, b, c = trio
    good, bad = os.urandom(2048), os.urandom(2048)
    a.blobs.put("u/run/1/y", bad)
    c.blobs.put("u/run/1/y", good)
    digest = hashlib.sha256(good).digest()
    check = lambda data: hashlib.sha256(data).digest() == digest  # noqa: E731
    before = b.bytes_down
    assert b.fetch([(a.peer_id, a.maddrs())], "u/run/1/y", max_bytes=1 << 20, deadline=time.monotonic() + 30,
                   verify=check) is None
    assert b.bytes_down - before == len(bad)  # asked once (before: every pass, ~60 copies in 30 s)
    before = b.bytes_down
    assert b.fetch([(a.peer_id, a.maddrs()), (c.peer_id, c.maddrs())], "u/run/1/y", max_bytes=1 << 20,
                   deadline=time.monotonic() + 30, verify=check) == good
    assert b.bytes_down - before <= len(bad) + len(good)  # the liar at most once, then the honest holder
    # holders read afresh every pass (as the update fetch reads holdings): the liar is not asked again, and a
    # holder that turns up later serves the blob
    a.blobs.put("u/run/1/z", bad)
    c.blobs.put("u/run/1/z", good)
    passes: list[int] = []

    def holders() -> list:
        passes.append(1)
        return [(a.peer_id, a.maddrs())] + ([(c.peer_id, c.maddrs())] if len(passes) > 1 else [])

    before = b.bytes_down
    assert b.fetch(holders, "u/run/1/z", max_bytes=1 << 20, deadline=time.monotonic() + 30, verify=check) == good
    assert len(passes) >= 2 and b.bytes_down - before == len(bad) + len(good)


def test_a_slow_holder_lookup_holds_up_no_stream_this_peer_serves(trio) -> None:
    """A fetch's holders come from a DHT read (the exchange's holdings), which can take seconds when nodes are
    out of reach. The read runs beside the event loop that serves this peer's streams, not on it: a download
    from this peer completes while its own lookup is still out (before, the loop sat in the read, and every
    download from the peer with it). Ordered by events, not timed: the lookup returns once that download is
    done, or after 20 s."""
    import os
    import threading

    a, b, c = trio
    mine, wanted = os.urandom(4096), os.urandom(4096)
    c.blobs.put("u/run/1/w", mine)
    a.blobs.put("u/run/1/v", wanted)
    downloaded, looked_up = threading.Event(), threading.Event()

    def slow_holders() -> list:  # stands for a DHT read that takes long
        downloaded.wait(120)  # returns once the download ended
        looked_up.set()
        return [(a.peer_id, a.maddrs())]

    pending = c.submit(c.fetch_async(slow_holders, "u/run/1/v", max_bytes=1 << 20, deadline=time.monotonic() + 60))
    got = b.fetch([(c.peer_id, c.maddrs())], "u/run/1/w", max_bytes=1 << 20, deadline=time.monotonic() + 40)
    still_out = not looked_up.is_set()
    downloaded.set()
    assert got == mine and still_out  # served while c's lookup was still out
    assert pending.result(60) == wanted


def test_a_key_another_process_runs_is_named_and_simulate_can_skip_the_check(trio) -> None:
    """swarm.identity_check (on by default) is hivemind's check at start that no other process reachable through
    the swarm runs the key: best effort (it asks the swarm for the key's peer id, which a busy swarm may not
    find in time), so what is tested here is what is ours. Its refusal reads in the user's words; with the check
    off (gradnode simulate's processes, each with a key of its own) a second process with a peer's key starts,
    as that peer's twin, without the extra daemon the check costs."""
    from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError

    said = transport.explain_start_failure(
        P2PDaemonError("Identity from `/run/peer-2/identity.key` is already taken by another peer"), [], [])
    assert said.startswith("another process runs this peer's key"), said
    a, b, _ = trio
    twin_of = SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=a.maddrs(), identity_check=False)
    twin = Transport(twin_of, b.identity)
    try:
        twin.start()
        assert twin.peer_id == b.peer_id
    finally:
        twin.close()


def test_an_initial_peer_whose_dht_does_not_answer_is_unanswered_not_a_fault(tmp_path: Path) -> None:
    """An initial peer whose libp2p daemon answers but whose DHT does not (a bootstrap still starting, or too busy
    to answer a ping in time): nobody answered, which a starting peer tries again for swarm.connect_timeout_s
    (Peer._connect), in the words of a silent address. Before, hivemind's words ("DHTNode bootstrap failed") read
    as a fault of the peer's own: it gave up at once, and in a flake hunt the other five peers of a test swarm
    then waited for it to the test's end."""
    import asyncio
    import shutil

    from hivemind.p2p import P2P

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    with transport.socket_folder() as sockets:  # as a transport's: hivemind's prefix, which the last one set
        daemon = asyncio.run_coroutine_threadsafe(  # a daemon with no DHT on it
            P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=str(load_or_create(tmp_path / "d").path)),
            loop).result(60)
    peer = None
    try:
        maddrs = [str(m) for m in asyncio.run_coroutine_threadsafe(daemon.get_visible_maddrs(), loop).result(30)]
        peer = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=maddrs),
                         load_or_create(tmp_path / "p"))
        with pytest.raises(TransportError) as err:
            peer.start(timeout=30)
        assert err.value.unanswered and str(err.value).startswith("no initial peer answered"), str(err.value)
    finally:
        if peer is not None:
            peer.close()  # whatever its failed start left: its event loop thread, its socket folder
        asyncio.run_coroutine_threadsafe(daemon.shutdown(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        shutil.rmtree(sockets, ignore_errors=True)


@contextlib.contextmanager
def clock_ahead(monkeypatch: pytest.MonkeyPatch, seconds: float, checked: bool = True):
    """While the block runs, every clock hivemind and the transport read runs ``seconds`` ahead (a DHT process
    started inside keeps it: it is forked); ``checked=False`` also lifts hivemind's start check, as for a clock
    that ran off after the start."""
    import hivemind.dht.node
    import hivemind.dht.protocol
    import hivemind.dht.routing
    import hivemind.utils
    import hivemind.utils.auth
    import hivemind.utils.timed_storage

    with monkeypatch.context() as m:
        ahead = functools.partial(lambda s: time.time() + s, seconds)
        for module in (hivemind.utils, hivemind.utils.timed_storage, hivemind.utils.auth, hivemind.dht.protocol,
                       hivemind.dht.routing, hivemind.dht.node, transport):
            m.setattr(module, "get_dht_time", ahead)
        if not checked:
            m.setattr(hivemind.dht.protocol, "MAX_DHT_TIME_DISCREPANCY_SECONDS", 10 ** 9)
        yield


def test_a_clock_off_the_initial_peers_is_refused_at_the_start_in_words_that_say_so(
        trio, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """hivemind refuses a DHT whose clock is more than 3 s off an initial peer's (its records expire by wall-clock
    time); the peer says which clock and by how much, and that trying again will not help."""
    peer = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=trio[0].maddrs()),
                     load_or_create(tmp_path / "ahead"))
    try:
        with clock_ahead(monkeypatch, 40.0), pytest.raises(TransportError) as err:
            peer.start(timeout=30)
    finally:
        peer.close()
    words = str(err.value)
    found = re.search(r"clock is ([0-9.]+) s ahead of the initial peer's", words)
    # 40 s less the time the initial peer took to stamp its answer (a loaded machine: a second or more)
    assert not err.value.unanswered and found and 30.0 <= float(found.group(1)) <= 40.1, words
    assert "NTP" in words, words


def test_a_peer_measures_its_clock_against_the_peers_its_dht_knows(trio, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Pings give each peer its clock against the others' (protocol/skew.py): after the start, where hivemind
    no longer looks, a clock 40 s ahead is found off by 40 s, and the right clocks find it and each other
    within their round trips."""
    ahead = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=trio[0].maddrs()),
                      load_or_create(tmp_path / "ahead"))
    try:
        with clock_ahead(monkeypatch, 40.0, checked=False):
            ahead.start(timeout=30)
        ahead.dial([(trio[1].peer_id, trio[1].maddrs()), (trio[2].peer_id, trio[2].maddrs())])
        # every ping answered (5 s each by default: on a loaded machine one can come later, and is left out)
        found = skew.estimate(ahead.clock_samples([t.peer_id for t in trio], timeout=30.0))
        assert found.peers == 3 and found.off() and abs(found.ahead_s - 40.0) <= found.error_s + 0.05, found
        # with no peers named, those its DHT knows, one sample per peer
        assert 1 <= skew.estimate(ahead.clock_samples()).peers <= 3
        right = [skew.estimate(t.clock_samples(timeout=30.0)) for t in trio]
        # each knows the other two right clocks at least: the one clock ahead is no majority
        assert all(r.peers >= 1 and abs(r.ahead_s) <= r.error_s + 0.05 for r in right), right
    finally:
        ahead.close()


def test_a_finished_record_is_verified_by_the_key_it_carries_and_only_its_authors(trio) -> None:
    """'finished' records outlive their authors' member records (a peer back after the run's end reads them):
    each is checked against the public key it carries, which must hash to its author; a record naming one
    key and carrying another, or stored under another key than its author's, is dropped."""
    from gradnode.node.swarm.membership import Membership
    from gradnode.protocol.records import Finished

    a, b, c = trio
    ma, mb, mc = (Membership(t, t.identity, "run", ttl=30.0) for t in trio)
    said = dict(run_id="run", round=6, param_hash="ab" * 8, time=a.now())
    assert ma.write("finished", None, Finished(peer=a.peer_id, public_key=a.identity.public_der, **said), ttl=60)
    # b claims to be... itself, with a's key (to borrow a's standing): the key hashes to a, not b
    assert mb.write("finished", None, Finished(peer=b.peer_id, public_key=a.identity.public_der, **said), ttl=60)
    got = mc.read("finished", None, Finished, fresh=True)
    assert [r.peer for r in got] == [a.peer_id] and mc.bad_records.get(b.peer_id) == 1, (got, mc.bad_records)
    # b stores a's genuine record again under its own key (its subkey holds one value: this one now)
    genuine = next(raw for owner, raw in c.get(dht_key("run", "finished")) if owner == a.peer_id)
    assert b.store(dht_key("run", "finished"), genuine, ttl=60)
    got = mc.read("finished", None, Finished, fresh=True)
    assert [r.peer for r in got] == [a.peer_id] and mc.bad_records.get(b.peer_id) == 2, (got, mc.bad_records)


def test_a_bootstrap_serves_the_finished_records_it_keeps_and_a_junk_list_hides_none(trio, tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """node/swarm/finished.py over real transports: a (a bootstrap) keeps the verified 'finished' record b stored
    in the DHT and serves it; c serves a junk list under the same name. A peer asking the initial peers it was
    given (a and c; never itself) gets b's record, verified, and only for the keys it asks about; an initial peer
    that does not answer, or answers that it is busy, hides nothing either, and the look says that one did not (it
    is no answer: a peer back after the run's end looks again before it takes the run for going on)."""
    from gradnode.node.swarm import finished
    from gradnode.node.swarm.finished import Kept, kept_elsewhere
    from gradnode.node.swarm.identity import load_or_create
    from gradnode.node.swarm.membership import Membership
    from gradnode.protocol.records import Finished, kept_blob, kept_finished_name

    a, b, c = trio
    monkeypatch.setattr(finished, "FETCH_S", 30.0)  # every look answered by both, however loaded the machine
    ma, mb = (Membership(t, t.identity, "run", ttl=30.0) for t in (a, b))
    assert mb.write("finished", None, Finished(peer=b.peer_id, public_key=b.identity.public_der, run_id="run",
                                               round=6, param_hash="ab" * 8, time=b.now()), ttl=60)
    kept = Kept(ma, a, tmp_path / "finished.msgpack", ttl=86400.0, every_s=0.0)
    assert settles(lambda: kept.refresh() or kept.records)
    c.blobs.put(kept_finished_name("run"), kept_blob([b"x"]))
    initial = [*a.maddrs(), *c.maddrs(), *b.maddrs()]
    for _ in range(3):  # both are asked every time: c's junk, whichever answers first, hides nothing
        got, whole = kept_elsewhere(mb, b, initial, {b.peer_id})
        assert [(r.peer, r.round) for r in got] == [(b.peer_id, 6)] and whole, got
    assert kept_elsewhere(mb, b, initial, {a.peer_id}) == ([], True)  # only the keys asked about
    silent = f"/ip4/127.0.0.1/tcp/1/p2p/{load_or_create(tmp_path / 'gone.key').peer_id}"  # nobody listens there
    got, whole = kept_elsewhere(mb, b, [*initial, silent], {b.peer_id})
    assert [(r.peer, r.round) for r in got] == [(b.peer_id, 6)] and not whole, got
    slots, a.upload_slots = a.upload_slots, 0  # a bootstrap whose slots for the list are taken answers 'busy'
    try:  # which says nothing of what it keeps (before, it read as an answer: holds none)
        assert kept_elsewhere(mb, b, initial, {b.peer_id}) == ([], False)
    finally:
        a.upload_slots = slots
    assert Kept(ma, a, tmp_path / "finished.msgpack", ttl=86400.0).records == kept.records  # as a restart reads it


def test_a_bootstrap_whose_address_book_is_gone_waits_for_its_port_to_come_free(tmp_path: Path, monkeypatch) -> None:
    """A bootstrap restarted on its port tries its address book first; nobody answering, its daemon exits on its own
    and it starts again without initial peers. The second start waits for the port the first daemon listened on
    (a loaded machine: seen as 'the port is in use' in the peers-back test, the bootstrap stopped). The first try is
    played by a socket that listens on the port and closes 0.5 s after the try failed; the second is the real
    start's first step, the check that the port is free (for as long as it is told to wait)."""
    import socket

    from gradnode.node.sim.simulate import _free_port

    port = _free_port("127.0.0.1")
    t = Transport(SwarmConfig(host_maddrs=[f"/ip4/127.0.0.1/tcp/{port}"]), load_or_create(tmp_path / "boot.key"))
    tries: list[list[str]] = []

    def start(timeout: float, initial: list[str], port_wait_s: float = 0.0) -> None:
        tries.append(initial)
        if initial:  # the address book's try: its daemon holds the port a moment after it failed
            held = socket.socket()
            held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            held.bind(("127.0.0.1", port))
            held.listen()
            threading.Timer(0.5, held.close).start()
            raise TransportError("no initial peer answered", unanswered=True)
        transport._check_ports_free(list(t.cfg.host_maddrs), port_wait_s)

    monkeypatch.setattr(t, "_start", start)
    t.start(extra_peers=["/ip4/127.0.0.1/tcp/9/p2p/QmPfdnRfXQjaUEhjxNMWbJt3AbhTYAsXFGb9oSrGUeQ1ad"])
    assert tries == [["/ip4/127.0.0.1/tcp/9/p2p/QmPfdnRfXQjaUEhjxNMWbJt3AbhTYAsXFGb9oSrGUeQ1ad"], []]


def test_the_own_copy_budget_refills_each_window_and_bounds_the_round() -> None:
    """At most ``cap`` copies per window, for the whole round: 1,000 fetchers asking over a 30 s round get
    at most cap x 30 copies from the sender, not one each; the rest must come from the holders."""
    budget = transport.CopyBudget(cap=2, window_s=1.0)
    assert [budget.take("u/r/0/a", t) for t in (0.0, 0.1, 0.2, 0.9)] == [True, True, False, False]
    assert budget.take("u/r/0/a", 1.0) and budget.take("u/r/0/a", 1.5) and not budget.take("u/r/0/a", 1.6)
    assert budget.take("u/r/0/b", 1.6)  # each blob has its own budget
    served = sum(budget.take("u/r/1/a", i * 0.03) for i in range(1000))
    assert served <= 2 * 30, served
    assert all(transport.CopyBudget(cap=0, window_s=1.0).take("x", 0.0) for _ in range(100))  # 0: no cap


def test_a_sender_past_its_copy_budget_says_busy_and_the_holder_serves(trio, tmp_path: Path) -> None:
    """The cap holds for a whole window on the real stream path: the sender serves one copy, answers the next
    fetcher 'busy', and that fetcher gets the update from the first one's copy."""
    a = trio[0]
    a._own_copies = transport.CopyBudget(cap=1, window_s=3600.0)
    b, c = trio[1], trio[2]
    name = update_name("run", 0, a.peer_id)
    blob = bytes(range(256)) * 400
    a.blobs.put(name, blob)
    assert b.fetch([(a.peer_id, a.maddrs())], name, max_bytes=10**7, deadline=time.monotonic() + 30) == blob
    b.blobs.put(name, blob)
    refusals = a.busy_refusals
    assert c.fetch([(a.peer_id, a.maddrs())], name, max_bytes=10**7, deadline=time.monotonic() + 2) is None
    assert a.busy_refusals > refusals
    got = c.fetch([(a.peer_id, a.maddrs()), (b.peer_id, b.maddrs())], name, max_bytes=10**7,
                  deadline=time.monotonic() + 30)
    assert got == blob and settles(lambda: b.bytes_up >= len(blob)), b.bytes_up

"""What the virtual simulator counts a peer moving: update bytes at the codec's size on links shared in turn,
the sender's copy budget, records at their real encoded sizes, and the same figures from a real transport."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gradnode.node.config import load_config
from gradnode.node.sim import sizes, traffic, virtual
from gradnode.node.swarm.identity import load_or_create
from gradnode.node.swarm.transport import RecordTraffic
from gradnode.protocol import records
from gradnode.protocol.params import CodecParams
from gradnode.protocol.wire import encode_update

CALM = dict(late_p=0.0, jitter_s=0.0, spread=0.0)  # no record late, no compute time apart: every round alike


@pytest.fixture(scope="module")
def identity(tmp_path_factory: pytest.TempPathFactory):
    return load_or_create(tmp_path_factory.mktemp("id") / "key")


def test_each_counted_record_is_as_long_as_a_real_signed_one(identity) -> None:
    """The simulator's record sizes are the node's: a real peer id, key and RSA-2048 signature."""
    fps = bytes(records.FINGERPRINT_BYTES * 7)
    me, sig = identity.peer_id, lambda r: r.signed(identity.sign(r.signing_bytes()))
    real = {
        "report": sig(records.Report(run_id=sizes.RUN_ID, round=12345, witness=me, base=sizes.HASH, included=fps)),
        "weights": sig(records.WeightHash(run_id=sizes.RUN_ID, round=12345, peer=me, param_hash=sizes.HASH,
                                          included=fps, update_bytes=18_350_000 * 7)),
        "holdings": sig(records.Holdings(run_id=sizes.RUN_ID, round=12345, peer=me, held=fps)),
        "announcement": sig(records.UpdateAnnouncement(run_id=sizes.RUN_ID, round=12345, sender=me,
                                                       digest=sizes.HASH, size=18_350_000, tokens=123456,
                                                       time=1.7e9)),
    }
    model = {"report": sizes.report(7), "weights": sizes.weights(7), "holdings": sizes.holdings(7),
             "announcement": sizes.announcement()}
    assert {k: len(r.to_bytes()) for k, r in real.items()} == model
    member = records.MemberRecord(
        run_id=sizes.RUN_ID, peer_id=me, public_key=identity.public_der, maddrs=sizes.MADDRS, round=12345,
        training=True, step_seconds=0.123456, inner_steps=30, tokens_per_s=12345.6, bytes_up=123456789,
        bytes_down=123456789, rejected=0, loss=3.21, software_version="0.1.0",
        protocol_version=records.PROTOCOL_VERSION, time=1.7e9, chain=[(12345 - i, sizes.HASH) for i in range(4)])
    assert len(sig(member).to_bytes()) == sizes.member(4)
    # a report grows by its fingerprints, past the node's cap too (the model of a swarm the node cannot run)
    assert sizes.report(1000) - sizes.report(10) == 990 * records.FINGERPRINT_BYTES + 1


def test_an_update_is_as_long_as_the_codec_writes_it() -> None:
    cfg = load_config(None)
    n = 1 << 24  # 16M parameters in big matrices: within 1 % of the size scaled from the sample
    g = torch.Generator().manual_seed(1)
    tensors = {f"w{i}": torch.randn(2048, 2048, generator=g) for i in range(n // (2048 * 2048))}
    real = len(encode_update(tensors, params=CodecParams(), run_id=sizes.RUN_ID, sender=sizes.PEER_ID)) + 256
    assert abs(sizes.update_bytes(cfg, n) - real) / real < 0.01
    assert 218 * 0.9 < 4 * 1_000_000_000 / sizes.update_bytes(cfg, 1_000_000_000) < 218 * 1.1  # the codec's ratio


def _run(**kw):
    return virtual.run(virtual.Scenario(**{**CALM, **kw}))


def test_every_peer_downloads_each_other_update_once_and_uploads_as_much_in_all() -> None:
    """All-to-all: per round a peer downloads N - 1 updates; the swarm uploads what it downloads."""
    n, size = 8, 50_000
    out = _run(peers=n, rounds=6, update_bytes=size)
    t = out["traffic"]
    assert t["update_bytes_down"] == {"min": (n - 1) * size, "median": (n - 1) * size, "max": (n - 1) * size}
    assert t["update_bytes_up"]["median"] > 0 and t["records_written"]["median"] >= 5  # update, report, member...
    assert set(t["records_read_by_table"]) == {"members", "updates", "reports", "weights", "holdings"}
    assert t["peak_updates_held"]["min"] == 6 * n  # the blob store's budget holds the whole run here


def test_the_sender_serves_its_copy_budget_and_holders_the_rest() -> None:
    """protocol/gossip.py's budget: a sender serves ``own_copies`` a window, the peers that verified its update
    serve the other fetchers; with no cap the sender uploads every copy itself."""
    n, size = 16, 200_000
    capped = _run(peers=n, rounds=4, update_bytes=size, own_copies=2)["traffic"]["update_bytes_up"]
    uncapped = _run(peers=n, rounds=4, update_bytes=size, own_copies=0)["traffic"]["update_bytes_up"]
    assert uncapped["min"] == uncapped["max"] == (n - 1) * size  # everyone fetched from the sender
    assert capped["max"] > capped["min"]  # relaying spreads unevenly
    assert capped["min"] < (n - 1) * size


def test_a_link_carries_one_transfer_at_a_time() -> None:
    """Fetches that start together from one sender end one transfer time apart (shared upload)."""
    sim = virtual.Simulation(virtual.Scenario(peers=4, own_copies=0, update_bytes=1_000_000, bandwidth_bps=8e6,
                                              **CALM))
    p, *qs = sim.peers.values()
    ends = [sim._fetch(p, q, 0, "d")[0] for q in qs]
    assert ends == pytest.approx([sim._latency(p.id, qs[0].id) + k for k in (1.0, 2.0, 3.0)])


def test_the_same_seed_gives_the_same_traffic() -> None:
    sc = virtual.Scenario(peers=8, rounds=5, seed=3, late_p=0.1)
    assert virtual.run(sc)["traffic"] == virtual.run(replace(sc))["traffic"]


def test_figures_per_round_are_taken_between_the_first_and_last_applied_round() -> None:
    c = traffic.Counters()
    c.read("members", 10, 1000)  # the start: no round yet
    c.applied_one(10.0)
    for k in range(4):
        c.read("members", 5, 1000)
        c.update_bytes_down += 7
        c.applied_one(12.0 + 2 * k)
    c.read("members", 100, 1000)  # the end: after the last round
    row = c.row()["per_round"]
    assert row["records_read"] == 5 and row["update_bytes_down"] == 7 and row["tables"] == {"members": 5}
    assert row["seconds"] == 2.0


def test_a_transport_counts_the_records_its_reads_returned_by_table() -> None:
    t = RecordTraffic()
    t.read("gradnode/run/members", 4, 4000, 0.01)
    t.read("gradnode/run/updates/3", 2, 900, 0.03)
    t.wrote("gradnode/run/updates/3", 450)
    assert t.totals() == {"reads": 2, "records_read": 6, "record_bytes_read": 4900, "records_written": 1,
                          "record_bytes_written": 450, "read_ms": 40}
    assert t.records_read_by_table() == {"members": 4, "updates": 2}


def test_a_poll_reads_a_report_from_when_it_came() -> None:
    """A DHT read returns what reached the reader by then: three reports that came as the round was decided
    were read once each, not at every poll since the round opened (half of them each poll, on average, was the
    model before: 4-peer swarms counted 1.5x the reports a real one reads)."""
    sim = virtual.Simulation(virtual.Scenario(peers=4, **CALM))
    p = sim.peers["p0000"]
    c = sim._open(p, 0, sender=False)
    others = [q for q in sim.peers if q != p.id]
    sim.now = c.start + 2.0
    p.reports_at[0] = dict.fromkeys(others, sim.now)
    sim._read_while_deciding(p, c)
    assert p.traffic.tables["reports"] == pytest.approx(len(others))
    p.reports_at[0] = dict.fromkeys(others, c.start)  # there from the start: read at every poll
    sim._read_while_deciding(p, c)
    every = virtual.core.POLL_S + 2 * sim.sc.dht_read_s
    assert p.traffic.tables["reports"] == pytest.approx(len(others) * (1 + 2.0 / every + 1))


def test_the_traffic_bench_finds_the_latency_that_gives_a_round_time() -> None:
    """``bench traffic`` matches the real swarm's round time by the latency of each record's and transfer's way:
    a round time the simulator made at a known latency is found again."""
    from gradnode.node.bench import traffic as bench
    from gradnode.node.sim import scenario

    cfg = load_config(None)
    made = virtual.run(scenario.of_config(cfg, peers=4, rounds=5, seed=0, compute_s=0.2, latency_s=0.4,
                                          dht_read_s=0.05))["traffic"]["round_s"]["median"]
    model, latency = bench.matched(cfg, {"traffic": {"round_s": {"median": made}, "dht_read_s": 0.05}}, 4, 5, 0,
                                   compute_s=0.2, busy_s=0.0)
    assert abs(model["traffic"]["round_s"]["median"] - made) <= 0.05 * made and 0.0 < latency < 2.0

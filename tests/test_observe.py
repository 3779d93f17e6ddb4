"""Watching a run: every process's Prometheus metrics and the status page, on a live 3-peer swarm started
with the real `gradnode simulate --serve`, and the page itself in a real headless Chromium (skipped where
none is installed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import TINY_SWARM, temp_leftovers

from gradnode.node.config import ConfigError, MetricsConfig
from gradnode.node.swarm.metrics import Exporter, Gauges, Role
from gradnode.node.swarm.report import Tally

pytestmark = pytest.mark.process  # starts processes or daemons (selectable for flake-hunt: -m process)

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as res:
            return res.status, dict(res.headers), res.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def scrape(target: str) -> dict[str, float]:
    """One scrape of host:port/metrics, parsed by prometheus_client's own parser: 'name{k="v"}' -> value."""
    from prometheus_client.parser import text_string_to_metric_families

    _, _, body = _get(f"http://{target}/metrics")
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def info_label(metrics: dict[str, float], key: str) -> str:
    found = [re.search(rf'{key}="([^"]*)"', k) for k in metrics if k.startswith("gradnode_peer_info{")]
    assert found and found[0], metrics
    return found[0].group(1)


# --- the exporter alone ---------------------------------------------------------------------------


def test_the_exporter_serves_the_peers_figures_and_every_rejection_reason() -> None:
    g = Gauges(round=7, train_loss=2.5, val_loss=2.75, tokens_per_s=1234.0, training_since=time.monotonic() - 4.0,
               tally=Tally(inner_s=3.0, wait_s=0.5, resyncs=2), peers_seen={Role.TRAIN: 3, Role.SERVE: 1},
               hash_agrees=False, rejected=lambda: {"QmA": {"forged": 2}, "QmB": {"forged": 1, "inflated_tokens": 4}},
               traffic=lambda: (1000, 2000))
    port = _free_port()
    ex = Exporter(MetricsConfig(port=port), g, "run-x", "QmSelf", "0.1.0")
    ex.start()
    try:
        m = scrape(f"127.0.0.1:{port}")
        busy = Exporter(MetricsConfig(port=port), g, "run-x", "QmSelf", "0.1.0")
        with pytest.raises(ConfigError, match="metrics.port"):
            busy.start()
    finally:
        ex.close()
    assert m["gradnode_round"] == 7 and m["gradnode_train_loss"] == 2.5 and m["gradnode_val_loss"] == 2.75
    assert m['gradnode_rejected_updates_total{reason="forged"}'] == 3
    assert m['gradnode_rejected_updates_total{reason="inflated_tokens"}'] == 4
    assert m['gradnode_rejected_updates_total{reason="malformed"}'] == 0  # present before the first rejection
    assert m["gradnode_sent_bytes_total"] == 1000 and m["gradnode_received_bytes_total"] == 2000
    assert m['gradnode_peers_seen{role="train"}'] == 3 and m["gradnode_hash_agrees"] == 0
    assert m["gradnode_resyncs_total"] == 2 and m["gradnode_wait_seconds_total"] == 0.5
    assert 0 < m["gradnode_compute_utilization"] <= 0.75  # 3 s of inner steps in 4 s and more
    assert info_label(m, "run") == "run-x" and info_label(m, "peer") == "QmSelf"
    with pytest.raises(OSError):  # closed: nothing listens any more
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_the_page_counts_chains_not_newest_hashes() -> None:
    """A peer one round ahead of the others follows their chain (it failed so once: a 3-peer swarm on one
    chain showed 'chains 2' while one peer had applied a round the others were still deciding)."""
    from gradnode.node.status.watch import SwarmWatch, _Seen
    from gradnode.protocol.records import MemberRecord

    def seen(peer: str, tail: list[tuple[int, str]]) -> _Seen:
        rec = MemberRecord(run_id="run-x", peer_id=peer, public_key=b"k" * 64, maddrs=[], round=tail[-1][0] + 1,
                           training=True, step_seconds=0.1, inner_steps=8, tokens_per_s=1.0, bytes_up=0,
                           bytes_down=0, rejected=0, software_version="0", protocol_version=2, time=1.0, chain=tail)
        return _Seen(record=rec, changed=time.monotonic())

    watch = SwarmWatch(membership=None, run_id="run-x")  # type: ignore[arg-type]  # snapshot reads no DHT
    a, b, c = ("Qm" + x * 30 for x in "ABC")
    h = lambda x: x * 16  # noqa: E731
    watch.peers = {a: seen(a, [(1, h("a1")), (2, h("a2"))]), b: seen(b, [(1, h("a1")), (2, h("a2")), (3, h("a3"))]),
                   c: seen(c, [(1, h("a1"))])}
    watch.membership = type("M", (), {"fresh_s": 60.0})()
    s = watch.snapshot()
    assert s["chains"] == 1 and all(p["agrees"] for p in s["peers"])
    watch.peers[c] = seen(c, [(1, h("a1")), (2, h("c2"))])  # a fork at round 2
    s = watch.snapshot()
    assert s["chains"] == 2 and [p["agrees"] for p in s["peers"]] == [True, True, False]
    # a 1-1 tie goes where the peers' own rule sends it: to the chain a peer serves, not a client-mode peer's
    # (whose state nobody can download) though its id is the lowest
    client = seen(a, [(1, h("a1")), (2, h("a2"))])
    client.record = client.record.model_copy(update={"reachable": False})
    watch.peers = {a: client, c: seen(c, [(1, h("a1")), (2, h("c2"))])}
    s = watch.snapshot()
    assert s["chains"] == 2 and [p["agrees"] for p in s["peers"]] == [False, True], s["peers"]


def test_metrics_are_off_unless_a_port_is_configured() -> None:
    ex = Exporter(MetricsConfig(), Gauges(), "run-x", "QmSelf", "0.1.0")
    ex.start()
    assert ex._server is None
    ex.close()


# --- a live swarm, watched ----------------------------------------------------------------------


def _wait(what: str, check: Any, timeout: float, proc: subprocess.Popen | None = None, log: Path | None = None) -> Any:
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        try:
            last = check()
            if last:
                return last
        except (OSError, ValueError, KeyError) as err:
            last = err
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(1.0)
    tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
    raise AssertionError(f"{what}: not within {timeout:.0f} s (last: {last!r})\n{tail}")


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`gradnode simulate --peers 3 --serve PORT` running, as a user starts it; stopped with SIGTERM after."""
    out = tmp_path_factory.mktemp("watched") / "run"
    port = _free_port()
    sets = [a for o in TINY_SWARM for a in ("--set", o)]
    log = out.parent / "simulate.log"
    before = temp_leftovers()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "gradnode.node.cli", "simulate", "--peers", "3", "--rounds",
                                 "1000", "--serve", str(port), "--output-dir", str(out), "--timeout", "3600", *sets],
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        targets_file = out / "prometheus-targets.json"
        targets = _wait("4 metrics targets", lambda: len(json.loads(targets_file.read_text())) == 4 and
                        {t["labels"]["process"]: t["targets"][0] for t in json.loads(targets_file.read_text())},
                        240, proc, log)
        yield {"port": port, "url": f"http://127.0.0.1:{port}/", "targets": targets, "out": out, "log": log,
               "proc": proc}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # simulate stops its peers and cleans up, as on Ctrl+C
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert temp_leftovers() <= before, f"left in the temp folder: {temp_leftovers() - before}"


def _trainers_at(watched: dict[str, Any], round_: int) -> dict[str, dict[str, float]]:
    found = {name: scrape(t) for name, t in watched["targets"].items() if name != "bootstrap"}
    return found if all(m.get("gradnode_round", 0) >= round_ for m in found.values()) else {}


def _settled(trainers: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The trainers' figures once each sees the whole swarm, agrees with its hash and has contributed: states
    a live swarm passes through at its own pace (a record lagging a round, a hash check pending), so they are
    waited for rather than expected at one scrape."""
    return trainers if trainers and all(
        m['gradnode_peers_seen{role="train"}'] == 3 and m['gradnode_peers_seen{role="serve"}'] == 1
        and m["gradnode_hash_agrees"] == 1 and m["gradnode_rounds_contributed_total"] >= 1
        for m in trainers.values()) else {}


@pytest.mark.swarm
def test_every_process_exposes_its_metrics_while_the_swarm_trains(watched: dict[str, Any]) -> None:
    trainers = _wait("3 peers at round 2 in their metrics, each seeing the swarm and agreeing",
                     lambda: _settled(_trainers_at(watched, 2)), 240, watched["proc"], watched["log"])
    for name, m in trainers.items():
        assert info_label(m, "role") == "train", name
        assert m['gradnode_peers_seen{role="train"}'] == 3, (name, m)
        assert m['gradnode_peers_seen{role="serve"}'] == 1, (name, m)
        assert m["gradnode_hash_agrees"] == 1, (name, m)
        assert m["gradnode_sent_bytes_total"] > 0 and m["gradnode_received_bytes_total"] > 0, (name, m)
        assert m["gradnode_tokens_per_second"] > 0 and 0 < m["gradnode_compute_utilization"] <= 1, (name, m)
        assert 0 < m["gradnode_train_loss"] < 10, (name, m)
        assert m["gradnode_rounds_contributed_total"] >= 1, (name, m)
        assert sum(v for k, v in m.items() if k.startswith("gradnode_rejected_updates_total")) == 0, (name, m)
    assert len({info_label(m, "peer") for m in trainers.values()}) == 3
    boot = _wait("the bootstrap seeing the 3 trainers", lambda: (lambda m: m if m['gradnode_peers_seen{role="train"}']
                 == 3 else None)(scrape(watched["targets"]["bootstrap"])), 180, watched["proc"], watched["log"])
    assert info_label(boot, "role") == "serve", boot
    assert boot["gradnode_round"] >= 1, boot
    # a training swarm moves updates: the trainers together send and receive more as rounds go by. Waited for,
    # not expected at the next round: a round's updates are all fetched before it is applied, so a scrape at
    # round r may already count them and the one at r+1 nothing new (CI saw that once); one peer may also send
    # nothing in a round, its update fetched from holders (the fresh-machine check saw that once)
    first = {n: m["gradnode_round"] for n, m in trainers.items()}
    totals = {c: sum(m[c] for m in trainers.values()) for c in ("gradnode_sent_bytes_total",
                                                                  "gradnode_received_bytes_total")}

    def grown() -> dict[str, dict[str, float]]:
        now = _trainers_at(watched, max(first.values()) + 1)
        return now if now and all(sum(m[c] for m in now.values()) > t for c, t in totals.items()) else {}

    _wait("rounds moving on, the trainers' traffic with them", grown, 240, watched["proc"], watched["log"])


def _api(watched: dict[str, Any]) -> dict[str, Any]:
    code, headers, body = _get(watched["url"] + "api/swarm")
    assert code == 200 and headers["Content-Type"] == "application/json"
    return json.loads(body)


@pytest.mark.swarm
def test_the_status_page_serves_the_swarm_from_its_records(watched: dict[str, Any]) -> None:
    def ready() -> dict[str, Any] | None:
        s = _api(watched)
        trainers = [p for p in s["peers"] if p["role"] == "train" and p["live"]]
        return s if len(trainers) == 3 and all(p["round"] >= 2 and len(p["losses"]) >= 2 for p in trainers) \
            and any(r["sent_bytes"] > 0 for r in s["rounds"]) and s["chains"] == 1 \
            and all(p["agrees"] is not False for p in s["peers"]) \
            and any(r["reports"] >= 2 and r["update_bytes"] and len(r["hashes"]) == 1 for r in s["rounds"]) else None

    s = _wait("3 trainers with 2 losses each on the page, on one chain", ready, 240, watched["proc"], watched["log"])
    peer_ids = {info_label(scrape(t), "peer") for n, t in watched["targets"].items() if n != "bootstrap"}
    assert {p["peer"] for p in s["peers"] if p["role"] == "train"} == peer_ids
    assert s["live_trainers"] == 3 and s["chains"] == 1 and s["round"] >= 2
    assert all(p["agrees"] is not False for p in s["peers"])
    assert [p["role"] for p in s["peers"]].count("serve") == 1
    # the bootstrap reads the simulate run folder around its own: the peers' names, and what their files tell
    named = {p["name"]: p for p in s["peers"] if p["role"] == "train"}
    assert set(named) == {"peer-0", "peer-1", "peer-2"}, s["peers"]
    assert named["peer-0"]["val_loss"] is not None  # the peer that evaluates: from its first evaluation on
    assert all(0 < p["utilization"] <= 1 and p["contributed"] is not None for p in named.values()), named
    assert {e["name"] for e in s["events"] if e["kind"] == "start"} == set(named), s["events"]
    assert s["progress"]["target"] == 1000  # `simulate --rounds` goes to the peers: the page reads their start events
    assert any(r["reports"] >= 2 and r["update_bytes"] and len(r["hashes"]) == 1 for r in s["rounds"]), s["rounds"]
    code, headers, body = _get(watched["url"])
    assert code == 200 and b"<title>gradnode status</title>" in body
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert _get(watched["url"] + "nope")[0] == 404


@pytest.mark.swarm
def test_gradnode_status_serve_watches_the_swarm_from_outside(watched: dict[str, Any]) -> None:
    """The stand-alone page: `gradnode status --initial-peer MADDR --serve 0`, stopped with Ctrl+C."""
    maddr = (watched["out"] / "bootstrap.maddrs").read_text().split()[0]
    proc = subprocess.Popen([sys.executable, "-m", "gradnode.node.cli", "status", "--initial-peer", maddr, "--serve",
                             "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        line = _wait("the page's address", lambda: proc.stdout.readline(), 180)
        while "status page:" not in line:
            line = proc.stdout.readline()
            assert line, "status --serve ended without printing its address"
        url = line.split("status page:", 1)[1].strip()
        s = _wait("3 trainers", lambda: (lambda s: s if s["live_trainers"] == 3 else None)(
            json.loads(_get(url + "api/swarm")[2])), 180)
        assert s["run"] and s["round"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    assert rc == 0, proc.stdout.read()


# --- the page in a real browser --------------------------------------------------------------------


def _browser() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found is None:
        pytest.skip("no headless browser installed (Debian: apt-get install chromium)")
    return found


def _chromium(browser: str, url: str, *args: str) -> str:
    run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                          "--no-first-run", "--virtual-time-budget=6000", *args, url],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


@pytest.mark.swarm
def test_the_status_page_in_headless_chromium(watched: dict[str, Any], tmp_path: Path) -> None:
    browser = _browser()
    _wait("3 trainers at round 2", lambda: _trainers_at(watched, 2), 180, watched["proc"], watched["log"])
    api = _api(watched)
    # the page shows what the records say when the browser loads it: one swarm and 3 trainers once every record
    # is fresh (a lagging record or a passing split is a state the swarm moves through, so it is waited for)
    dom = _wait("one swarm of 3 trainers on the page", lambda: (lambda d: d if "(one swarm)" in d and
                re.search(r'id="trainers">3<', d) else None)(_chromium(browser, watched["url"], "--dump-dom")),
                240, watched["proc"], watched["log"])
    rows = dict(re.findall(r'<tr data-peer="(Qm\w+)"[^>]*>.*?<td class="round">(\d+)</td>', dom))
    trainers = {p["peer"]: p["round"] for p in api["peers"] if p["role"] == "train"}
    assert set(trainers) <= set(rows), (trainers, rows)
    assert all(int(rows[p]) >= 2 for p in trainers), rows
    assert "(one swarm)" in dom and re.search(r'id="trainers">3<', dom), dom[:3000]
    assert dom.count("<polyline") >= 3  # a loss curve per trainer
    assert re.search(r'<tr data-round="\d+">', dom)
    shot = Path(os.environ.get("GRADNODE_SCREENSHOT_DIR", tmp_path)) / "status-page.png"
    _chromium(browser, watched["url"], f"--screenshot={shot}", "--window-size=1400,1100")
    assert shot.exists() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_the_page_shows_what_peers_write_as_text_only(tmp_path: Path) -> None:
    """Every string on the page is a peer's claim: markup in one stays text (no element, no script runs)."""
    from gradnode.node.status.server import StatusServer

    browser = _browser()
    evil = '<img src=x onerror="document.title=\'owned\'">'
    snap = {"run": evil, "polls": 1, "interval_s": 2.0, "live_trainers": 1, "round": 3, "chains": 1,
            "time": time.time(), "rounds": [],
            "peers": [{"peer": "Qm" + "a" * 44, "role": "train", "round": 3, "tokens_per_s": 1.0, "loss": 2.0,
                       "bytes_up": 1, "bytes_down": 1, "rejected": 0, "ignored_by": 0, "hash": "ab" * 8,
                       "hash_round": 2, "agrees": True, "last_seen_s": 1.0, "live": True, "version": evil,
                       "admitted": False, "losses": [[1, 3.0], [2, 2.5]]}]}
    server = StatusServer(lambda: snap, "127.0.0.1", 0)
    server.start()
    try:
        dom = _chromium(browser, server.url, "--dump-dom")
    finally:
        server.close()
    assert "&lt;img src=x" in dom and "<img" not in dom, dom[:3000]
    assert "<title>gradnode status</title>" in dom  # the handler never ran


# --- TensorBoard and Weights & Biases, when installed ------------------------------------------------


ROWS = [{"round": r, "loss": 3.0 - r / 10, "val_loss": None if r < 2 else 2.9, "wait_s": 0.1, "bytes_up": 1000 * r,
         "bytes_down": 900 * r, "rejected": 0, "resyncs": 0, "applied": 3, "tokens": 512, "utilization": 0.9,
         "hash": "ab" * 32} for r in range(3)]


def test_round_rows_become_tensorboard_scalars(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard", reason="TensorBoard not installed (pip install 'gradnode[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gradnode.node.swarm.metrics import RoundSinks

    sinks = RoundSinks(MetricsConfig(tensorboard_dir=tmp_path / "tb"), "run-x", "QmSelfPeerId0123456789")
    for row in ROWS:
        sinks.log(row)
    sinks.close()
    acc = EventAccumulator(str(tmp_path / "tb" / "QmSelfPeerId0123"))
    acc.Reload()
    loss = [(e.step, round(e.value, 4)) for e in acc.Scalars("loss")]
    assert loss == [(0, 3.0), (1, 2.9), (2, 2.8)]
    assert [(e.step, e.value) for e in acc.Scalars("val_loss")] == [(2, pytest.approx(2.9))]  # None: not logged
    assert "hash" not in acc.Tags()["scalars"]


def test_round_rows_go_to_wandb_offline_without_an_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="wandb not installed (pip install 'gradnode[wandb]')")
    from gradnode.node.swarm.metrics import RoundSinks

    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    sinks = RoundSinks(MetricsConfig(wandb_project="gradnode-test"), "run-x", "QmSelfPeerId0123456789")
    for row in ROWS:
        sinks.log(row)
    run = sinks._wandb
    assert run.offline and run.project == "gradnode-test" and run.name == "QmSelfPeerId0123"
    assert run.summary["loss"] == pytest.approx(2.8) and run.summary["val_loss"] == pytest.approx(2.9)
    assert run.summary["_step"] == 2
    sinks.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("run-*.wandb")), list(tmp_path.rglob("*"))[:20]


def test_a_missing_extra_is_named_before_any_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gradnode.node.swarm.metrics import RoundSinks

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"gradnode\[wandb\]"):
        RoundSinks(MetricsConfig(wandb_project="p"), "run-x", "QmSelf")

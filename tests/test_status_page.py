"""The run page: the snapshot JSON of the swarm watch and of the run-folder reader (who is behind or off the
majority, the validation loss, utilisation, rounds in, out and sat out, events, progress and ETA, peer
names), the peer's event file, `gradnode status --run-dir`, and the page in a real headless Chromium
(skipped where /usr/bin/chromium is absent)."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gradnode.node.status import figures
from gradnode.node.status.runfolder import RunFolder, around
from gradnode.node.status.server import StatusServer
from gradnode.node.status.watch import SwarmWatch
from gradnode.node.swarm import events
from gradnode.node.swarm.events import Kind
from gradnode.node.swarm.report import append_metrics
from gradnode.protocol.records import MemberRecord, WeightHash

CHROMIUM = Path("/usr/bin/chromium")
IDS = {f"peer-{i}": "Qm" + c * 44 for i, c in enumerate("abcd")}
EVIL = '<img src=x onerror="document.title=\'owned\'">'
log = logging.getLogger("gradnode.node.swarm.peer")  # the peer's own logger: what its event file takes in


def _logged(folder: Path, *lines: tuple[int, str, dict[str, Any]]) -> None:
    """Log ``lines`` (level, message, extra) as a peer with its event file in ``folder`` does."""
    folder.mkdir(parents=True, exist_ok=True)
    handler = events.install(folder)
    before = logging.getLogger().level
    logging.getLogger().setLevel(logging.INFO)
    try:
        for level, message, extra in lines:
            log.log(level, message, extra=extra)
    finally:
        logging.getLogger().setLevel(before)
        events.uninstall(handler)


def _start(name: str) -> tuple[int, str, dict[str, Any]]:
    return logging.INFO, "training from round=0", events.tag(Kind.START, peer=IDS[name], run="run-x", rounds=6,
                                                             version="0.9.1")


def _rows(folder: Path, t0: float, rounds: range, *, fork_from: int | None = None, excluded: int = 0,
          abstained: int = 0, banned: list[str] | None = None, val_loss: float | None = None) -> None:
    """Metrics rows as the peer writes them, a round every 10 s from ``t0``; from round ``fork_from`` on, its
    weights differ from everyone else's; each row carries the last validation loss (``val_loss``)."""
    for r in rounds:
        off = fork_from is not None and r >= fork_from
        append_metrics(folder / "metrics.jsonl", {
            "round": r, "loss": 5.0 - r / 10, "hash": ("fe" if off else f"{r:02d}") * 32, "time": t0 + 10 * r,
            "bytes_up": 1000 * (r + 1), "bytes_down": 2000 * (r + 1), "started": t0, "utilization": 0.8,
            "resyncs": 1 if off else 0, "rejected": 0, "val_loss": val_loss, "own_included": True,
            "contributed": r + 1 - excluded - abstained, "excluded": excluded, "abstained": abstained,
            "banned": banned or []})


def make_run(root: Path, *, finished: bool = False) -> Path:
    """A simulate run folder of 4 peers: peer-0 and peer-1 on the majority (peer-0 evaluated before its first
    round), peer-2 off it from round 3 (re-synced), peer-3 stuck after 2 rounds."""
    t0 = time.time() - 60
    _logged(root / "peer-0", _start("peer-0"),
            (logging.INFO, "round=0 val_loss=5.5500 (before training)",
             events.tag(Kind.EVAL, rounds_applied=0, val_loss=5.55)),
            (logging.WARNING, "update rejected sender=%s reason=forged round=2" % IDS["peer-3"], {}))
    _rows(root / "peer-0", t0, range(5), banned=[IDS["peer-3"]], val_loss=5.55)
    _logged(root / "peer-1", _start("peer-1"))
    _rows(root / "peer-1", t0, range(5))
    _logged(root / "peer-2", _start("peer-2"),
            (logging.INFO, "state adopted reason=hash mismatch round=3", events.tag(Kind.RESYNC, reason="hash mismatch")),
            (logging.WARNING, "clock off: " + EVIL, events.tag(Kind.CLOCK, ahead_s=12.5)))
    _rows(root / "peer-2", t0, range(5), fork_from=3, excluded=1, abstained=1)
    _logged(root / "peer-3", _start("peer-3"))
    _rows(root / "peer-3", t0, range(2))
    if finished:
        for name, r in (("peer-0", 6), ("peer-1", 6), ("peer-2", 6), ("peer-3", 2)):
            _logged(root / name, (logging.INFO, f"run over for this peer at round={r}",
                                  events.tag(Kind.END, rounds_applied=r, reached=r == 6,
                                             val_loss=5.25 if name == "peer-0" else None)),
                    (logging.WARNING, "dht get failed: the DHT process has exited", {}))  # its shutdown's
    return root


def _by_name(snap: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in snap["peers"]}


# --- the peer's event file ---------------------------------------------------------------------------


def test_the_event_file_keeps_tagged_lines_and_warnings_only(tmp_path: Path) -> None:
    _logged(tmp_path, (logging.INFO, "round=4 applied=3", {}),  # an ordinary line: not an event
            (logging.INFO, "state adopted reason=fork round=7", events.tag(Kind.RESYNC, reason="fork")),
            (logging.WARNING, "round=9 undecided", {}), (logging.ERROR, "checkpoint not written", {}))
    lines = [json.loads(x) for x in (tmp_path / events.FILE_NAME).read_text().splitlines()]
    assert [(e["kind"], e.get("round")) for e in lines] == [("resync", 7), ("warning", 9), ("error", None)]
    assert lines[0]["reason"] == "fork" and lines[0]["message"].startswith("state adopted")


def test_a_sender_ignored_for_invalid_updates_is_a_ban_event(tmp_path: Path) -> None:
    from gradnode.node.swarm.exchange import Rejections

    rejections = Rejections(ignore_after=2, ignore_rounds=5)
    handler = events.install(tmp_path)
    try:
        rejections.add(IDS["peer-3"], "forged", 1)
        rejections.add(IDS["peer-3"], "forged", 2)
    finally:
        events.uninstall(handler)
    lines = [json.loads(x) for x in (tmp_path / events.FILE_NAME).read_text().splitlines()]
    assert [e["kind"] for e in lines] == ["warning", "warning", "ban"]
    assert lines[-1]["peer"] == IDS["peer-3"] and lines[-1]["round"] == 2


def test_a_flood_of_one_message_is_capped_and_counted(tmp_path: Path) -> None:
    handler = events.EventFile(tmp_path)
    start = time.time()
    for i in range(events.BURST + 5):
        handler.handle(logging.LogRecord("gradnode.x", logging.WARNING, __file__, 1, "record rejected author=%s",
                                         (f"Qm{i}",), None))
    later = logging.LogRecord("gradnode.x", logging.WARNING, __file__, 1, "record rejected author=%s", ("QmZ",), None)
    later.created = start + events.WINDOW_S + 1
    handler.handle(later)
    lines = [json.loads(x) for x in (tmp_path / events.FILE_NAME).read_text().splitlines()]
    assert len(lines) == events.BURST + 1
    assert lines[-1]["suppressed"] == 5 and "QmZ" in lines[-1]["message"]


def test_the_event_file_stays_bounded(tmp_path: Path) -> None:
    handler = events.EventFile(tmp_path, max_bytes=4000)
    for i in range(200):  # distinct templates: no burst cap, only the size bound
        handler.handle(logging.LogRecord("gradnode.x", logging.WARNING, __file__, 1, f"warning number {i} " + "x" * 40,
                                         (), None))
    now, rotated = tmp_path / events.FILE_NAME, tmp_path / (events.FILE_NAME + ".1")
    assert rotated.exists() and now.stat().st_size <= 4000 and rotated.stat().st_size <= 4000
    assert "warning number 199" in now.read_text()
    events.EventFile(tmp_path / "gone" / "away").handle(  # an unwritable folder costs the event, nothing more
        logging.LogRecord("gradnode.x", logging.WARNING, __file__, 1, "lost", (), None))


# --- the run folder ----------------------------------------------------------------------------------


def test_a_run_folder_names_its_peers_and_flags_who_is_behind_or_off_the_majority(tmp_path: Path) -> None:
    snap = RunFolder(make_run(tmp_path / "run")).snapshot()
    p = _by_name(snap)
    assert list(p) == ["peer-0", "peer-1", "peer-2", "peer-3"] and snap["source"] == "folder"
    assert {n: q["peer"] for n, q in p.items()} == IDS and snap["run"] == "run-x"
    assert p["peer-2"]["agrees"] is False and p["peer-0"]["agrees"] is True  # round 4: peer-2's hash against two
    assert p["peer-3"]["behind"] is True and p["peer-3"]["lag"] == 3 and not p["peer-0"]["behind"]
    assert not p["peer-2"]["behind"] and snap["chains"] == 2  # off the majority, not behind it
    assert p["peer-0"]["round"] == 5 and p["peer-0"]["state"] == "running" and snap["live_trainers"] == 4


def test_two_peers_apart_name_no_majority(tmp_path: Path) -> None:
    """Two peers, two hashes: neither is off a majority (each is judged at the newest round that has one)."""
    t0 = time.time() - 60
    for name, fork in (("peer-0", None), ("peer-1", 3)):
        _logged(tmp_path / name, _start(name))
        _rows(tmp_path / name, t0, range(5), fork_from=fork)
    p = _by_name(RunFolder(tmp_path).snapshot())
    assert (p["peer-0"]["agrees"], p["peer-1"]["agrees"]) == (True, True) and p["peer-1"]["hash_round"] == 2


def test_a_run_folder_gives_val_loss_utilisation_and_rounds_in_and_out(tmp_path: Path) -> None:
    p = _by_name(RunFolder(make_run(tmp_path / "run")).snapshot())
    assert p["peer-0"]["val_loss"] == 5.55
    assert [v[:2] for v in p["peer-0"]["val_losses"]] == [[0, 5.55]]  # the rows carry it on: one evaluation
    assert p["peer-1"]["val_loss"] is None
    assert p["peer-0"]["utilization"] == 0.8
    assert (p["peer-2"]["contributed"], p["peer-2"]["excluded"], p["peer-2"]["abstained"]) == (3, 1, 1)
    assert p["peer-2"]["resyncs"] == 1 and p["peer-0"]["version"] == "0.9.1"
    assert [q[:2] for q in p["peer-0"]["losses"]] == [[r, 5.0 - r / 10] for r in range(5)]
    assert all(isinstance(q[2], float) for q in p["peer-0"]["losses"])  # a wall-clock time per point


def test_the_val_loss_shows_before_the_first_round(tmp_path: Path) -> None:
    """A peer evaluates before it trains: its event says so at once, with no metrics row yet."""
    _logged(tmp_path / "peer-0", _start("peer-0"),
            (logging.INFO, "round=0 val_loss=5.5500", events.tag(Kind.EVAL, rounds_applied=0, val_loss=5.55)))
    p = _by_name(RunFolder(tmp_path).snapshot())["peer-0"]
    assert p["val_loss"] == 5.55 and p["round"] == 0 and p["losses"] == []


def test_a_run_folder_tells_its_events(tmp_path: Path) -> None:
    snap = RunFolder(make_run(tmp_path / "run")).snapshot()
    kinds = {(e["name"], e["kind"]) for e in snap["events"]}
    assert {("peer-2", "resync"), ("peer-2", "clock"), ("peer-0", "warning"), ("peer-3", "ban")} <= kinds
    assert not any(e["kind"] == "eval" for e in snap["events"])  # evaluations are the validation curve
    ban = next(e for e in snap["events"] if e["kind"] == "ban")
    assert ban["peer"] == IDS["peer-3"] and "reputation" in ban["message"]
    times = [e["time"] for e in snap["events"]]
    assert times == sorted(times) and len(times) <= figures.MAX_EVENTS


def test_progress_and_eta_against_the_run_rounds(tmp_path: Path) -> None:
    snap = RunFolder(make_run(tmp_path / "run")).snapshot()
    pr = snap["progress"]
    assert (pr["round"], pr["target"], pr["round_s"], pr["eta_s"]) == (5, 6, 10.0, 10.0)
    assert pr["fraction"] == pytest.approx(5 / 6) and not pr["finished"] and pr["elapsed_s"] >= 40
    assert RunFolder(tmp_path / "run", target_rounds=20).snapshot()["progress"]["eta_s"] == 150.0  # swarm.rounds wins


def test_a_finished_run_reads_as_finished(tmp_path: Path) -> None:
    snap = RunFolder(make_run(tmp_path / "run", finished=True)).snapshot()
    p = _by_name(snap)
    assert snap["progress"]["finished"] and snap["progress"]["eta_s"] == 0.0 and snap["live_trainers"] == 0
    assert [q["state"] for q in p.values()] == ["finished", "finished", "finished", "stopped"]
    assert p["peer-0"]["val_loss"] == 5.25 and [v[0] for v in p["peer-0"]["val_losses"]] == [0, 6]
    assert p["peer-3"]["behind"] and not p["peer-2"]["behind"]  # stopped early
    told = [e["message"] for e in snap["events"]]
    assert any(m.startswith("update rejected") for m in told) and not any("DHT process" in m for m in told)


def test_a_growing_file_is_read_from_where_it_ended(tmp_path: Path) -> None:
    folder = tmp_path / "peer-0"
    _logged(folder, _start("peer-0"))
    reader = RunFolder(tmp_path, refresh_s=0.0)
    _rows(folder, time.time(), range(2))
    assert _by_name(reader.snapshot())["peer-0"]["round"] == 2
    with open(folder / "metrics.jsonl", "a") as f:
        f.write('{"round": 2, "loss": 4.0, "time": 1.0')  # a line being written: not read yet
    assert _by_name(reader.snapshot())["peer-0"]["round"] == 2
    with open(folder / "metrics.jsonl", "a") as f:
        f.write(', "hash": "<b>x</b>"}\n{"round": "three"}\n')
    assert _by_name(reader.snapshot())["peer-0"]["round"] == 3  # the line finished counts; a bad round, no row
    assert reader.folders["peer-0"].rows.rows[-1]["hash"] is None  # no hex, no hash


def test_a_long_file_is_read_from_its_tail(tmp_path: Path) -> None:
    folder = tmp_path / "peer-0"
    folder.mkdir()
    row = json.dumps({"round": 0, "loss": 1.0, "time": 1.0, "pad": "x" * 900})
    with open(folder / "metrics.jsonl", "w") as f:
        for r in range(6000):  # ~5.6 MB: more than one read takes from the start
            f.write(row.replace('"round": 0', f'"round": {r}') + "\n")
    reader = RunFolder(tmp_path)
    reader.refresh()
    rows = reader.folders["peer-0"].rows.rows
    assert rows[-1]["round"] == 5999 and 0 < len(rows) <= 400  # the newest rows at the first look


def test_a_line_without_end_is_not_kept_whole(tmp_path: Path) -> None:
    from gradnode.node.status.runfolder import READ_BYTES

    folder = tmp_path / "peer-0"
    folder.mkdir()
    (folder / "metrics.jsonl").write_bytes(b'{"round": 0, "pad": "')
    reader = RunFolder(tmp_path, refresh_s=0.0)
    for _ in range(3):  # a file growing by a line that never ends
        reader.refresh()
        with open(folder / "metrics.jsonl", "ab") as f:
            f.write(b"x" * (READ_BYTES // 2))
    reader.refresh()
    assert len(reader.folders["peer-0"].rows.partial) <= READ_BYTES


def test_a_simulate_bootstrap_reads_the_run_folder_around_it(tmp_path: Path) -> None:
    make_run(tmp_path / "run")
    (tmp_path / "run" / "bootstrap").mkdir()
    assert around(tmp_path / "run" / "bootstrap") == tmp_path / "run"
    assert around(tmp_path / "run" / "peer-0") == tmp_path / "run" / "peer-0"


def test_gradnode_status_run_dir_prints_the_snapshot(tmp_path: Path) -> None:
    from gradnode.node.cli import app

    res = CliRunner().invoke(app, ["status", "--run-dir", str(make_run(tmp_path / "run", finished=True))])
    assert res.exit_code == 0, res.output
    snap = json.loads(res.output)
    assert snap["progress"]["finished"] and _by_name(snap)["peer-2"]["agrees"] is False
    res = CliRunner().invoke(app, ["status", "--run-dir", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "no such folder" in res.output


# --- the swarm watch ---------------------------------------------------------------------------------


def _record(peer: str, round_: int, tail: list[tuple[int, str]], written: float, **kw: Any) -> MemberRecord:
    return MemberRecord(run_id="run-x", peer_id=peer, public_key=b"k" * 64, maddrs=[], round=round_, training=True,
                        step_seconds=0.1, inner_steps=8, tokens_per_s=100.0, bytes_up=1000 * round_,
                        bytes_down=2000 * round_, rejected=0, loss=5.0 - round_ / 10, software_version="0.9.1",
                        protocol_version=2, time=written, chain=tail, **kw)


def _swarm(r: int, c_forked: bool) -> dict[str, MemberRecord]:
    """peer-0 and peer-1 at round ``r`` on one chain; peer-2 stuck at round 2, on a fork when ``c_forked``."""
    a, b, c = IDS["peer-0"], IDS["peer-1"], IDS["peer-2"]
    main = [(k, f"{k:02d}" * 8) for k in range(r)]
    stuck = [(0, "00" * 8), (1, "cc" * 8 if c_forked else "01" * 8)]
    return {a: _record(a, r, main, r), b: _record(b, r, main, r, ignoring=[c] if c_forked else []),
            c: _record(c, 2, stuck, r)}  # every record written again since the last poll (heartbeats)


def _watched(folder: RunFolder | None = None) -> SwarmWatch:
    watch = SwarmWatch(None, "run-x", target_rounds=6, folder=folder)
    t0 = time.time() - 40
    watch.observe(_swarm(3, False), {}, wall=t0)
    reports = {4: [WeightHash(run_id="run-x", round=4, peer=p, param_hash="04" * 32) for p in IDS.values()]}
    watch.observe(_swarm(5, True), reports, wall=t0 + 20)
    return watch


def test_the_watch_flags_who_is_behind_or_off_the_majority() -> None:
    snap = _watched().snapshot()
    p = {q["peer"]: q for q in snap["peers"]}
    a, c = p[IDS["peer-0"]], p[IDS["peer-2"]]
    assert c["agrees"] is False and c["behind"] is True and c["lag"] == 3
    assert a["agrees"] is True and not a["behind"] and c["ignored_by"] == 1
    assert snap["chains"] == 2 and snap["round"] == 5
    assert a["val_loss"] is None and a["name"] is None  # no run folder: what records do not carry is unknown


def test_the_watch_tells_what_changed_as_events() -> None:
    snap = _watched().snapshot()
    said = [(e["peer"], e["kind"], e["message"]) for e in snap["events"]]
    assert said[0][0] is None and said[0][2].startswith("watching: 3 trainer(s)")
    c = IDS["peer-2"]
    assert any(p == c and k == "fork" and "off the majority" in m for p, k, m in said), said
    assert any(p == c and k == "behind" for p, k, m in said) and any(p == c and k == "ban" for p, k, m in said)
    assert any(p is None and k == "fork" and "2 chains" in m for p, k, m in said), said


def test_the_watch_paces_the_eta_by_the_rounds_it_saw() -> None:
    pr = _watched().snapshot()["progress"]
    assert (pr["round"], pr["target"], pr["round_s"], pr["eta_s"]) == (5, 6, 10.0, 10.0)  # 2 rounds in 20 s


def test_the_watch_keeps_the_round_of_trainers_that_left() -> None:
    """A trainer's last record says it left: still a trainer, and the swarm's round stays where it ended, also
    once no record is left."""
    watch = _watched()
    gone = {p: m.model_copy(update={"training": False, "leaving": True, "time": 9.0})
            for p, m in _swarm(6, False).items()}
    watch.observe(gone, {})
    snap = watch.snapshot()
    assert snap["round"] == 6 and {p["role"] for p in snap["peers"]} == {"train"} and snap["live_trainers"] == 0
    assert snap["progress"]["finished"] and snap["progress"]["eta_s"] == 0.0
    watch.observe({}, {})  # their records expired too
    assert watch.snapshot()["round"] == 6


def test_the_watch_adds_what_the_run_folder_tells(tmp_path: Path) -> None:
    snap = _watched(RunFolder(make_run(tmp_path / "run"))).snapshot()
    p = {q["peer"]: q for q in snap["peers"]}
    a, c = p[IDS["peer-0"]], p[IDS["peer-2"]]
    assert (a["name"], c["name"]) == ("peer-0", "peer-2")
    assert a["val_loss"] == 5.55 and a["utilization"] == 0.8 and (c["excluded"], c["abstained"]) == (1, 1)
    kinds = {(e["name"], e["kind"], e.get("source")) for e in snap["events"]}
    assert ("peer-2", "resync", "peer") in kinds and ("peer-2", "fork", "watch") in kinds  # its own, the watch's
    assert snap["progress"]["target"] == 6


def test_the_watch_lists_named_peers_in_their_folders_order(tmp_path: Path) -> None:
    ten, two = "Qm" + "a" * 44, "Qm" + "c" * 44  # the ids sort the other way round
    for name, peer in (("peer-10", ten), ("peer-2", two)):
        _logged(tmp_path / name, (logging.INFO, "training from round=0", events.tag(Kind.START, peer=peer)))
    watch = SwarmWatch(None, "run-x", folder=RunFolder(tmp_path))
    stranger = "Qm" + "b" * 44
    watch.observe({p: _record(p, 1, [(0, "00" * 8)], 1.0) for p in (ten, two, stranger)}, {})
    assert [(q["name"], q["peer"]) for q in watch.snapshot()["peers"]] == [("peer-2", two), ("peer-10", ten),
                                                                           (None, stranger)]


# --- the page in a real browser ----------------------------------------------------------------------


def _dom(server: StatusServer, profile: Path, *more: str) -> str:
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (Debian: apt-get install -y chromium)")
    run = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                          "--no-first-run", "--disable-background-networking", "--disable-component-update",
                          "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=5000", *more,
                          "--dump-dom", server.url], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def _served(snapshot: Any) -> StatusServer:
    server = StatusServer(snapshot, "127.0.0.1", 0)
    server.start()
    return server


def _row_of(dom: str, peer: str) -> str:
    found = re.search(rf'<tr( class="[^"]*")? data-peer="{peer}">(.*?)</tr>', dom, re.S)
    assert found, dom[:3000]
    return found.group(0)


@pytest.mark.process
def test_the_run_page_of_a_run_folder_in_headless_chromium(tmp_path: Path) -> None:
    server = _served(RunFolder(make_run(tmp_path / "run")).snapshot)
    try:
        dom = _dom(server, tmp_path / "profile")
    finally:
        server.close()
    assert re.search(r'id="round">5<', dom) and re.search(r'id="target"> / 6<', dom), dom[:3000]
    assert re.search(r'id="eta">10 s<', dom) and re.search(r'id="flagged"[^>]*>2<', dom)
    late, off, ok = (_row_of(dom, IDS[n]) for n in ("peer-3", "peer-2", "peer-0"))
    assert 'class="behind' in late and "behind 3" in late
    assert "off" in off.split(">", 1)[0] and "off majority" in off and "3 / 1 / 1" in off
    assert "peer-0" in ok and '<td class="val">5.550</td>' in ok and '<td class="util">80%</td>' in ok
    assert "state adopted reason=hash mismatch" in dom and dom.count('<tr data-kind=') >= 4
    assert "&lt;img src=x" in dom and "<img" not in dom  # a peer's string stays text
    assert dom.count("<polyline") >= 2 and 'class="val"' in dom  # loss curves, and the validation points


@pytest.mark.process
def test_the_live_page_with_the_run_folder_in_headless_chromium(tmp_path: Path) -> None:
    watch = _watched(RunFolder(make_run(tmp_path / "run")))
    server = _served(watch.snapshot)
    try:
        dom = _dom(server, tmp_path / "profile")
    finally:
        server.close()
    assert re.search(r'id="chains"[^>]*>2 \(split!\)<', dom) and re.search(r'id="trainers">3<', dom), dom[:3000]
    stuck = _row_of(dom, IDS["peer-2"])
    assert "peer-2" in stuck and "off majority" in stuck and "behind 3" in stuck
    assert '<td class="val">5.550</td>' in _row_of(dom, IDS["peer-0"])
    assert "off the majority" in dom and "watching: 3 trainer(s)" in dom

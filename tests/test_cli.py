"""What a newcomer meets on the command line: help without placeholders, --version, one-line errors that
name what to check (bad or silent peer addresses, a port in use, an unwritable folder, a missing config),
--plot checked before any work, a live view that fits 80 columns, and Ctrl+C in `gradnode train`."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gradnode.node import cli
from gradnode.node.cli import app

pytestmark = pytest.mark.process  # starts processes or daemons (selectable for flake-hunt: -m process)

runner = CliRunner()
# a well-formed peer address that nobody answers (a real peer id; port 9 is discard, closed here)
SILENT = "/ip4/127.0.0.1/tcp/9/p2p/QmPk5SDMjSGEC5nnj1J7rJpxJeoVK6nFM4JQUEbj8Ux5qR"
TINY = ["--set", "model.n_layer=1", "--set", "model.d_model=32", "--set", "model.n_head=2", "--set",
        "model.seq_len=32", "--set", "inner.batch_size=2", "--set", "inner.steps=4", "--set", "inner.device=cpu"]


def gradnode(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradnode.node.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def all_commands() -> list[list[str]]:
    import typer.main

    group = typer.main.get_command(app)
    out = [[]]
    for name, cmd in group.commands.items():
        out.append([name])
        out += [[name, sub] for sub in getattr(cmd, "commands", {})]
    return out


@pytest.mark.parametrize("path", all_commands(), ids=lambda p: " ".join(p) or "gradnode")
def test_help_has_no_type_placeholders_and_describes_every_option(path: list[str]) -> None:
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    placeholders = re.findall(r"<[a-z][a-z\[\] ,]*>", result.output)  # typer's <bool>, <list[str]>, <path> ...
    assert not placeholders and "[STR]" not in result.output, placeholders
    import typer.main

    cmd = typer.main.get_command(app)
    for part in path:
        cmd = cmd.commands[part]
    undescribed = [p.name for p in cmd.params if not getattr(p, "hidden", False) and not (p.help or "").strip()]
    assert not undescribed, f"options without a description: {undescribed}"


def test_top_level_help_lists_what_people_start_with_first_one_line_each() -> None:
    out = runner.invoke(app, ["--help"], env={"COLUMNS": "110"}).output
    names = [n for n in cli.COMMANDS if n in out]
    assert names == list(cli.COMMANDS) and out.index(" simulate ") < out.index(" admit ") < out.index(" check-config ")
    for name, (_, short) in cli.COMMANDS.items():  # whole, on the command's own line: nothing wraps or is cut
        assert any(line.startswith(f"│ {name} ") and short in line for line in out.splitlines()), (name, out)


@pytest.mark.parametrize("path", all_commands(), ids=lambda p: " ".join(p) or "gradnode")
def test_help_at_80_columns_cuts_no_word(path: list[str]) -> None:
    """A word too long for its column is cut with an ellipsis: examples must break where a line may."""
    out = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80"}).output
    assert "…" not in out, [line for line in out.splitlines() if "…" in line]


def test_version() -> None:
    from gradnode.node import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"gradnode {__version__}"


def test_config_mistakes_name_the_key_without_pydantic_prefixes(tmp_path: Path) -> None:
    result = runner.invoke(app, ["check-config", "--set", "inner.lrr=1e-3"])
    assert result.exit_code == 2 and "inner.lrr: unknown key; did you mean `lr`?" in result.output
    result = runner.invoke(app, ["check-config", "--set", "model.d_model=130"])
    assert result.exit_code == 2 and "model.d_model (130) must be divisible by model.n_head (4)" in result.output
    assert "Value error" not in result.output
    result = runner.invoke(app, ["train", "--config", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 2 and f"config file not found: {tmp_path / 'missing.yaml'}" in result.output


def test_a_config_mistake_is_blamed_on_where_it_was_made(tmp_path: Path) -> None:
    """A mistyped --set is the override's fault, not the file's; a folder is named as one, with its files."""
    preset = str(Path(__file__).resolve().parents[1] / "configs" / "tiny-cpu.yaml")
    result = runner.invoke(app, ["check-config", "-c", preset, "--set", "inner.lrr=1e-3"])
    assert result.exit_code == 2 and "(from --set inner.lrr=1e-3)" in result.output, result.output
    assert preset not in result.output
    (tmp_path / "bad.yaml").write_text("inner:\n  lrr: 1\n")
    result = runner.invoke(app, ["check-config", "-c", str(tmp_path / "bad.yaml"), "--set", "inner.lr=1e-3"])
    assert f"invalid config {tmp_path / 'bad.yaml'}:" in result.output and "(from" not in result.output
    result = runner.invoke(app, ["check-config", "-c", str(tmp_path)])
    assert result.exit_code == 2 and f"{tmp_path} is a folder: name a config file in it, e.g. " \
        f"{tmp_path / 'bad.yaml'}" in result.output, result.output


def test_logs_after_a_command_go_to_the_stderr_of_the_moment(capsys: pytest.CaptureFixture[str]) -> None:
    """A command sets up logging while stderr is some stream that is later closed (a test runner's capture);
    a record logged afterwards (the next test, a simulate in the same process) must not hit the closed stream."""
    import contextlib
    import io
    import logging

    from gradnode.node import cli

    was = logging.getLogger().handlers[:]
    try:
        with contextlib.redirect_stderr(io.StringIO()) as gone:
            cli._setup_logging(False)
        gone.close()
        logging.getLogger("gradnode.test").warning("after the command")
        err = capsys.readouterr().err
        assert "after the command" in err and "Logging error" not in err, err
    finally:
        logging.basicConfig(handlers=was, force=True)


@pytest.mark.parametrize("args", [["join", "--initial-peer", "/ip4/1.2.3.4/tcp/31337"],
                                  ["status", "-p", "not-an-address"],
                                  ["join", "-p", "/ip4/1.2.3.4/tcp/31337/p2p/QmNotAPeerId"],
                                  ["simulate", "--set", "swarm.initial_peers=['/ip4/999.1.1.1/tcp/1/p2p/x']"]])
def test_malformed_peer_address_is_one_line_and_exit_2(args: list[str], tmp_path: Path) -> None:
    result = runner.invoke(app, [*args, "--output-dir", str(tmp_path)] if args[0] != "status" else args)
    assert result.exit_code == 2, result.output
    lines = [x for x in result.output.splitlines() if x.strip()]
    assert "Traceback" not in result.output and any("/p2p/" in x or "multiaddr" in x for x in lines), lines
    assert not list(tmp_path.iterdir())  # refused before anything was made


@pytest.mark.swarm
@pytest.mark.parametrize("command", ["join", "status"])
def test_silent_peer_address_names_it_and_what_to_check(command: str, tmp_path: Path) -> None:
    # a starting peer keeps trying for swarm.connect_timeout_s (a restarted bootstrap comes back): not here
    args = ["--initial-peer", SILENT] + (["--output-dir", str(tmp_path), "--set", "swarm.connect_timeout_s=0"]
                                         if command == "join" else [])
    done = gradnode(command, *args)
    assert done.returncode == 2, done.stderr
    errors = [x for x in done.stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and SILENT in errors[0] and "check that" in errors[0], done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.swarm
def test_simulate_with_a_silent_initial_peer_says_so(tmp_path: Path) -> None:
    done = gradnode("simulate", "--peers", "1", "--rounds", "1", "--output-dir", str(tmp_path / "run"),
                    "--set", f"swarm.initial_peers=['{SILENT}']", "--set", "swarm.connect_timeout_s=0")
    assert done.returncode == 2, done.stderr
    assert "error: the bootstrap did not start: no initial peer answered" in done.stderr and SILENT in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.swarm
def test_port_in_use_and_unwritable_folder(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        done = gradnode("bootstrap", "--host", f"/ip4/127.0.0.1/tcp/{port}", "--set", f"run.output_dir={tmp_path}")
    assert done.returncode == 2 and f"cannot listen on /ip4/127.0.0.1/tcp/{port}: the port is in use" in done.stderr
    for args in (["join", "--initial-peer", SILENT], ["train"], ["simulate"]):
        result = runner.invoke(app, [*args, "--output-dir", "/proc/gradnode-run"])
        assert result.exit_code == 2 and "cannot write to /proc/gradnode-run" in result.output, result.output


def test_join_without_an_initial_peer_says_what_it_needs(tmp_path: Path) -> None:
    """A join with no initial peer would wait for good; one back in a run folder that knows peers finds them."""
    result = runner.invoke(app, ["join", "--output-dir", str(tmp_path)])
    assert result.exit_code == 2 and "join needs --initial-peer MADDR" in result.output, result.output


def test_a_peer_says_which_address_to_share_and_why() -> None:
    lines = cli.address_lines(["/ip4/127.0.0.1/tcp/31337/p2p/QmA", "/ip4/192.168.1.10/tcp/31337/p2p/QmA"])
    assert lines[0].startswith("share this address") and "open tcp port 31337" in lines[0]
    assert lines[1] == "/ip4/192.168.1.10/tcp/31337/p2p/QmA"  # the network's address first, loopback after
    assert "this machine only" in lines[2] and lines[3] == "/ip4/127.0.0.1/tcp/31337/p2p/QmA"
    assert "--announce /ip4/PUBLIC_IP/tcp/31337" in lines[-1]  # a private address: what NAT needs
    public = cli.address_lines(["/ip4/1.2.3.4/tcp/4001/p2p/QmA"])  # announced public: nothing more to do
    assert "reachable from any machine" in public[0] and not any("--announce" in x for x in public)
    alone = cli.address_lines(["/ip4/127.0.0.1/tcp/9/p2p/QmA"])
    assert "loopback only" in alone[0] and "/ip4/0.0.0.0/tcp/9" in alone[0]


def test_plot_without_matplotlib_stops_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on a machine without it: `import` fails
    for args in (["simulate", "--output-dir", str(tmp_path / "run")], ["bench", "quality", "--size", "tiny"]):
        result = runner.invoke(app, [*args, "--plot", str(tmp_path / "loss.png")])
        assert result.exit_code == 2 and "--plot needs matplotlib: pip install 'gradnode[plot]'" in result.output
    assert not (tmp_path / "run").exists()


def test_a_failed_plot_keeps_the_result(capsys: pytest.CaptureFixture) -> None:
    def draw() -> None:
        raise OSError("disk full")

    cli._plot(draw, Path("x.png"))  # after the summary was printed: reports, does not raise
    assert "plot not written (OSError: disk full)" in capsys.readouterr().err


def test_live_view_fits_80_columns_and_names_peers_like_the_summary(tmp_path: Path) -> None:
    from rich.console import Console

    from gradnode.node.sim import simulate as sim

    s = sim.SimSettings(peers=8, rounds=500, config=None, out_dir=tmp_path)
    row = {"round": 488, "loss": 3.14159, "hash": "e80a12345678", "applied": 64, "bytes_up": 123_456_789,
           "bytes_down": 987_654_321, "wait_s": 123.45, "rejected": 999, "resyncs": 12}
    from gradnode.node.swarm.progress import Reporter, Stage

    for i in range(7):
        (tmp_path / f"peer-{i}").mkdir()
        (tmp_path / f"peer-{i}" / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    computing = Reporter(tmp_path / "peer-0")
    computing.stage(Stage.COMPUTING, 489, steps=1000)
    computing.step(999, 1.5)
    computing.flush()
    (tmp_path / "peer-7").mkdir()
    Reporter(tmp_path / "peer-7").stage(Stage.WAITING_FOR_PEERS, 0, "1 of 2 training peers in sight")
    console = Console(width=80, record=True)
    console.print(sim.live_table(s, time.monotonic() - 3600))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80 and "…" not in text
    assert "peer-0" in text and "489/500" in text and "3.142" in text
    # inner steps within a round, and what a peer that has no round yet waits for
    assert "999/1000" in text and re.search(r"peer-7 +0/500 .* peers", text), text
    summary = {"rounds": 2, "seconds": 12.3456, "val_loss_first": 5.3232749700546265,
               "val_loss_last": 2.863780230283737, "identical_hashes": True, "link": "none",
               "peers": [{"peer": "QmPeerIdOfTheFirstPeer", "index": 0, "rounds": 2, "final_loss": 2.91234,
                          "param_hash": "e80a1234abcd", "bytes_up": 1e6, "bytes_down": 2e6, "utilization": 0.95,
                          "rejected_updates": 0}]}
    console = Console(width=100, record=True)
    sim.print_summary(summary, console)
    text = console.export_text()
    assert "5.323 -> 2.864" in text and "peer-0" in text and "5.3232749" not in text


def test_plural() -> None:
    assert cli.plural(1, "peer") == "1 peer" and cli.plural(3, "peer") == "3 peers"


def test_train_ctrl_c_stops_with_a_checkpoint_and_the_same_command_resumes(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "gradnode.node.cli", "train", "--output-dir", str(tmp_path), "--rounds", "400",
            *TINY]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert first.startswith(f"run folder: {tmp_path}"), first
        end = time.monotonic() + 600  # returns as soon as one is written: a loaded machine's slow start waits
        while not list((tmp_path / "checkpoints").glob("round-*")) and time.monotonic() < end:
            time.sleep(0.2)  # training is under way once the first checkpoint is written
        assert list((tmp_path / "checkpoints").glob("round-*")), "no checkpoint written: training never started"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "stopped in round" in err and "Resume with the same command" in err, err
    assert "val loss" in out and "Traceback" not in err  # the summary the README promises
    resumed = gradnode("train", "--output-dir", str(tmp_path), "--rounds", "1", *TINY)
    assert "resuming from" in resumed.stderr and "--fresh starts over" in resumed.stderr, resumed.stderr
    fresh = gradnode("train", "--output-dir", str(tmp_path), "--rounds", "1", "--fresh", *TINY)
    assert fresh.returncode == 0 and "--fresh: removing" in fresh.stderr and "resuming" not in fresh.stderr


def test_health_reads_the_peers_report_and_stays_light(tmp_path: Path) -> None:
    """`gradnode health` (a compose healthcheck, 5 s limit on a busy machine): exit 0 only on a fresh, ok
    report; one line why otherwise; and it never imports torch (a second of CPU per check under load)."""
    from gradnode.node.swarm import health

    missing = gradnode("health", "--output-dir", str(tmp_path))
    assert missing.returncode == 1 and "no readable" in missing.stdout
    health.write(tmp_path, view=health.ChainView(trainers=3), round_=7, expected=3, waiting=False)
    ok = gradnode("health", "--output-dir", str(tmp_path))
    assert ok.returncode == 0 and ok.stdout.startswith("healthy: round 7"), ok.stdout
    health.write(tmp_path, view=health.ChainView(trainers=2, groups=2, on_winner=False), round_=8, expected=3,
                 waiting=False)
    split = gradnode("health", "--output-dir", str(tmp_path))
    assert split.returncode == 1 and "off the chain" in split.stdout and "sees 2 of 3" in split.stdout
    # a clock off the peers' (protocol/skew.py) by more than the DHT allows is a reason of its own; within, none
    from gradnode.protocol.skew import Sample, estimate

    ahead = estimate([Sample(sent=1000.0, theirs=960.1, received=1000.2)])
    health.write(tmp_path, view=health.ChainView(trainers=3), round_=9, expected=3, waiting=True, clock=ahead)
    off = gradnode("health", "--output-dir", str(tmp_path))
    assert off.returncode == 1 and "clock is 40.0 s (+-0.1) ahead of the swarm's" in off.stdout, off.stdout
    assert "NTP" in off.stdout and "waiting for peers" in off.stdout, off.stdout
    near = estimate([Sample(sent=1000.0, theirs=1001.0, received=1000.2)])
    health.write(tmp_path, view=health.ChainView(trainers=3), round_=9, expected=3, waiting=False, clock=near)
    assert gradnode("health", "--output-dir", str(tmp_path)).returncode == 0
    assert json.loads((tmp_path / "health.json").read_text())["clock_ahead_s"] == -0.9
    data = json.loads((tmp_path / "health.json").read_text())
    (tmp_path / "health.json").write_text(json.dumps({**data, "ok": True, "time": time.time() - 120}))
    stale = gradnode("health", "--output-dir", str(tmp_path))
    assert stale.returncode == 1 and "hung or gone" in stale.stdout
    health.write(tmp_path, view=health.ChainView(trainers=3), round_=10, expected=3, waiting=False, finished=True)
    ended = gradnode("health", "--output-dir", str(tmp_path))  # a peer that finished its run is not hung
    assert ended.returncode == 1 and "ended at round 10" in ended.stdout and "hung" not in ended.stdout
    probe = subprocess.run([sys.executable, "-c", "import sys; from gradnode.node.cli import app; "
                            "from gradnode.node.swarm import health; print('torch' in sys.modules)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip() == "False", probe.stderr

"""The README's "Two machines" section, run as written on two hosts: two network namespaces joined by a veth pair.

Machine A runs the README's `gradnode bootstrap` line, machine B its `gradnode join` line with the address A
said to share. Both train the run's rounds and end on one hash.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gradnode.node.sim import netns

ROOT = Path(__file__).resolve().parents[1]
OK, WHY = netns.available()
pytestmark = [pytest.mark.swarm, pytest.mark.skipif(not OK, reason=f"network namespaces unavailable: {WHY}")]
END_S = 900.0  # a run of the README's rounds that has not ended by then hangs (far beyond a loaded machine's)


def readme_commands() -> tuple[str, str]:
    """The `gradnode bootstrap` and `gradnode join` lines of the README's "Two machines" section."""
    text = ROOT.joinpath("README.md").read_text()
    section = re.split(r"\n##+ ", text.split("\n## Two machines\n", 1)[1], maxsplit=1)[0]
    lines = [line.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S) for line in block.splitlines()]
    boot = [line for line in lines if line.startswith("gradnode bootstrap ")]
    join = [line for line in lines if line.startswith("gradnode join ")]
    assert len(boot) == 1 and len(join) == 1, lines
    return boot[0], join[0]


def start(prefix: list[str], command: str, cwd: Path, log: Path) -> subprocess.Popen:
    """``command`` (a README line, `gradnode ...`) on one host, in ``cwd``, its output in ``log``."""
    args = shlex.split(command)
    assert args[0] == "gradnode"
    with log.open("w") as out:
        return subprocess.Popen([*prefix, sys.executable, "-m", "gradnode.node.cli", *args[1:]], cwd=cwd, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def shared_address(log: Path) -> str | None:
    """The line after 'share this address', as the bootstrap printed it."""
    lines = log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines[:-1]):
        if line.startswith("share this address"):
            return lines[i + 1].strip()
    return None


def summary(log: Path) -> tuple[int, str]:
    found = re.findall(r"^rounds=(\d+) train_loss=\S+ val_loss=\S+ hash=(\w+)", log.read_text(errors="replace"), re.M)
    assert found, log.read_text(errors="replace")[-3000:]
    return int(found[-1][0]), found[-1][1]


def test_the_readmes_two_machine_commands_train_on_two_hosts_and_end_on_one_hash(tmp_path: Path) -> None:
    boot_cmd, join_cmd = readme_commands()
    rounds = int(re.search(r"--rounds (\d+)", join_cmd).group(1))
    homes = {k: tmp_path / k for k in ("a", "b")}
    for home in homes.values():  # each machine holds a checkout's configs/ and runs the commands from there
        home.mkdir()
        (home / "configs").symlink_to(ROOT / "configs")
    procs: list[subprocess.Popen] = []
    try:
        with netns.Hosts() as hosts:
            a_log, b_log = tmp_path / "a.log", tmp_path / "b.log"
            procs.append(start(hosts.exec_prefix(0), boot_cmd, homes["a"], a_log))
            end = time.monotonic() + END_S
            while shared_address(a_log) is None:
                assert procs[0].poll() is None and time.monotonic() < end, a_log.read_text()[-3000:]
                time.sleep(0.2)
            shared = shared_address(a_log)
            # A says to share its address on the network, not loopback, and why
            assert shared.startswith(f"/ip4/{hosts.ip[0]}/tcp/31337/p2p/"), a_log.read_text()
            assert "open tcp port 31337" in a_log.read_text()
            joined = re.sub(r"--initial-peer \S+", f"--initial-peer {shared}", join_cmd)
            procs.append(start(hosts.exec_prefix(1), joined, homes["b"], b_log))
            for proc, log in ((procs[1], b_log), (procs[0], a_log)):
                try:
                    proc.wait(timeout=max(1.0, end - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pytest.fail(f"still running after {END_S:.0f} s:\n{log.read_text()[-3000:]}")
                assert proc.returncode == 0, log.read_text()[-3000:]
            (a_rounds, a_hash), (b_rounds, b_hash) = summary(a_log), summary(b_log)
            assert a_rounds == b_rounds == rounds
            assert a_hash == b_hash, f"A ended on {a_hash}, B on {b_hash}"
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

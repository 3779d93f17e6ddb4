"""The Docker image across hosts: a bootstrap whose libp2p port is published and announced, and a peer that
joins it through that address alone (GRADNODE_INITIAL_PEER), with no volume between them. Runs
`scripts/docker_swarm.sh remote`; skips where no Docker engine answers (CI starts none)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "gradnode:cpu"


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except subprocess.TimeoutExpired:
        return False


pytestmark = [pytest.mark.process,
              pytest.mark.skipif(not _docker_answers(), reason="no Docker engine answers `docker info`")]


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=False).stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def test_a_peer_joins_a_remote_bootstrap_through_its_published_address_and_both_end_on_one_hash() -> None:
    """The bootstrap trains too, so that two containers end on one hash; the image stays only if it was there."""
    project = f"gn-test-{os.getpid()}"
    had_image = bool(_docker("image", "ls", "-q", IMAGE).strip())
    env = {**os.environ, "PROJECT": project, "PEERS": "1", "ROUNDS": "3", "TIMEOUT": "900",
           "GRADNODE_P2P_HOST_PORT": str(_free_port())}
    try:
        run = subprocess.run(["bash", str(ROOT / "scripts" / "docker_swarm.sh"), "remote"], env=env,
                             capture_output=True, text=True, timeout=1800, check=False)
    finally:
        if not had_image:
            _docker("rmi", IMAGE)
    tail = (run.stdout + run.stderr)[-4000:]
    assert run.returncode == 0, tail
    assert "identical final hashes: True" in run.stdout, tail
    # nothing of the run is left: its containers (their anonymous volumes with them) and its network
    assert not _docker("ps", "-aq", "--filter", f"name={project}-").strip()
    assert not _docker("network", "ls", "-q", "--filter", f"name={project}-net").strip()

"""Permissioned runs (node/swarm/admission.py): the run authority named in the genesis admits peers with
signed certificates (`gradnode admit`) and revokes them (`gradnode revoke`). A peer without a valid
certificate is nobody: its member record is dropped, its other records fail verification (no key is
known for it), and its streams are refused. Open runs (no authority) admit anyone."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from _tiny import TINY
from gradnode.node.config import SwarmConfig
from gradnode.node.swarm import admission
from gradnode.node.swarm.admission import Gate
from gradnode.node.swarm.identity import load_or_create
from gradnode.node.swarm.membership import Membership
from gradnode.node.swarm.transport import Transport
from gradnode.protocol.records import Report, dht_key

pytestmark = pytest.mark.process  # starts processes or daemons (selectable for flake-hunt: -m process)
# a well-formed peer address that nobody answers: the checks before any network come first
SILENT = "/ip4/127.0.0.1/tcp/9/p2p/QmPk5SDMjSGEC5nnj1J7rJpxJeoVK6nFM4JQUEbj8Ux5qR"

RUN = "demo-0123456789abcdef"
SETS = [f"--set=model.{k}={v}" for k, v in TINY["model"].items()] + ["--set=run.run_id=demo"]


def gradnode(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gradnode.node.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("keys")
    return {name: load_or_create(folder / f"{name}.key") for name in ("authority", "a", "b", "c")}


def test_the_gate_checks_signer_run_peer_expiry_and_revocation(keys) -> None:
    auth, a, c = keys["authority"], keys["a"], keys["c"]
    now = time.time()
    gate = Gate(RUN, auth.public_der, lambda: now)
    good = admission.admit(auth, RUN, a.peer_id, now + 60)
    assert gate.why_not(a.peer_id, good) is None
    assert gate.why_not(a.peer_id, b"") == "no admission certificate"
    assert gate.why_not(c.peer_id, good) == "admission certificate of another run or peer"  # a's, shown by c
    assert gate.why_not(a.peer_id, admission.admit(auth, "other-run", a.peer_id, now + 60)) == \
        "admission certificate of another run or peer"
    assert gate.why_not(a.peer_id, admission.admit(c, RUN, a.peer_id, now + 60)) == \
        "admission certificate not signed by the run authority"  # c signs for itself
    assert gate.why_not(a.peer_id, admission.admit(auth, RUN, a.peer_id, now - 1)) == "admission certificate expired"
    assert gate.why_not(a.peer_id, b"\x93garbage") == "malformed admission certificate"
    gate.take_revocations([admission.revocation(c, RUN, [a.peer_id], now)])  # not the authority's: no effect
    assert gate.why_not(a.peer_id, good) is None
    gate.take_revocations([admission.revocation(auth, RUN, [a.peer_id], now)])
    assert gate.why_not(a.peer_id, good) == "admission revoked"
    gate.take_revocations([admission.revocation(auth, RUN, [], now - 10)])  # an older list does not undo it
    assert gate.why_not(a.peer_id, good) == "admission revoked"
    gate.take_revocations([admission.revocation(auth, RUN, [c.peer_id], now + 10)])  # nor a newer one without it
    assert gate.why_not(a.peer_id, good) == "admission revoked" and gate.revoked == {a.peer_id, c.peer_id}
    assert Gate(RUN, None, lambda: now).why_not(c.peer_id, b"") is None  # an open run


@pytest.mark.swarm
def test_an_intruder_is_nobody_and_a_revoked_peer_becomes_one(keys, tmp_path: Path) -> None:
    """Real transports: a and b are admitted, c is not. c's member record and proposal are dropped, its
    streams refused; once the authority revokes b (a signed list in the DHT), b is dropped the same way."""
    auth = keys["authority"]
    gate = lambda t: Gate(RUN, auth.public_der, t.now)  # noqa: E731
    made: list[Transport] = []
    try:
        for name in ("a", "b", "c"):
            cfg = SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                              initial_peers=made[0].maddrs() if made else [])
            t = Transport(cfg, load_or_create(tmp_path / f"{name}.key"))
            made.append(t)
            t.start()
        a, b, c = made
        certs = {t.peer_id: admission.admit(auth, RUN, t.peer_id, time.time() + 600) for t in (a, b)}
        members = [Membership(t, t.identity, RUN, ttl=30.0, gate=gate(t), admission=certs.get(t.peer_id, b""))
                   for t in made]
        for t, m in zip(made, members):
            t.admits = m.admitted
        common = dict(round_=1, training=True, step_seconds=1.0, inner_steps=4, tokens_per_s=1.0, rejected=0,
                      loss=None)
        for m in members:
            assert m.publish(**common)
        ma, mb, mc = members
        assert set(ma.members(max_age=0)) == {a.peer_id, b.peer_id}
        assert mc.write("reports", 1, Report(run_id=RUN, round=1, witness=c.peer_id))
        assert mb.write("reports", 1, Report(run_id=RUN, round=1, witness=b.peer_id))
        assert [p.witness for p in ma.read("reports", 1, Report)] == [b.peer_id]
        assert ma.bad_records.get(c.peer_id, 0) >= 1
        # the same DHT read without the gate (an open run): c is a member and its proposal counts
        open_view = Membership(a, a.identity, RUN, ttl=30.0)
        assert c.peer_id in open_view.members(max_age=0)
        assert sorted(p.witness for p in open_view.read("reports", 1, Report)) == sorted([b.peer_id, c.peer_id])
        a.blobs.put("u/x", b"x" * 1000)
        assert b.fetch([(a.peer_id, a.maddrs())], "u/x", max_bytes=10**6, deadline=time.monotonic() + 60) is not None
        assert c.fetch([(a.peer_id, a.maddrs())], "u/x", max_bytes=10**6, deadline=time.monotonic() + 3) is None

        # the authority revokes b; any peer may carry the signed list into the DHT
        assert a.store(dht_key(RUN, "revocations"), admission.revocation(auth, RUN, [b.peer_id], a.now()), ttl=60)
        ma._revocations_at = 0.0  # read at the next refresh (every 5 s otherwise)
        assert set(ma.members(max_age=0)) == {a.peer_id}
        assert ma.public_key(b.peer_id) is None  # b's records no longer verify here
        assert b.fetch([(a.peer_id, a.maddrs())], "u/x", max_bytes=10**6, deadline=time.monotonic() + 3) is None
    finally:
        for t in made:
            t.close()


def test_admit_from_the_command_line_and_a_peer_without_a_certificate_does_not_start(keys, tmp_path: Path) -> None:
    key = tmp_path / "authority.key"
    key.write_bytes(keys["authority"].path.read_bytes())
    done = gradnode("run", "init", "--out", str(tmp_path / "run.json"), "--authority-key", str(key), *SETS)
    assert done.returncode == 0, done.stderr
    run_id = done.stdout.strip().removeprefix("run id: ")
    peer = keys["a"].peer_id
    done = gradnode("admit", peer, "--genesis", str(tmp_path / "run.json"), "--authority-key", str(key),
                    "--out", str(tmp_path / "a.cert"))
    assert done.returncode == 0, done.stderr
    gate = Gate(run_id, keys["authority"].public_der, time.time)
    assert gate.why_not(peer, (tmp_path / "a.cert").read_bytes()) is None
    other = tmp_path / "other.key"
    other.write_bytes(keys["c"].path.read_bytes())
    done = gradnode("admit", peer, "--genesis", str(tmp_path / "run.json"), "--authority-key", str(other),
                    "--out", str(tmp_path / "b.cert"))
    assert done.returncode == 2 and "is not the authority key" in done.stderr
    # a peer of the permissioned run without a certificate stops before any network, saying what to ask for
    done = gradnode("join", *SETS, "--genesis", str(tmp_path / "run.json"), "--output-dir", str(tmp_path / "p"),
                    "--initial-peer", SILENT,
                    "--set=swarm.host_maddrs=[/ip4/127.0.0.1/tcp/0]", "--no-eval")
    assert done.returncode == 2 and "admits only peers its authority certified" in done.stderr, done.stderr[-1500:]


@pytest.mark.swarm
def test_revoke_from_the_command_line_reaches_the_running_run(keys, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Each revoke publishes the whole list, the peers revoked before included; one whose read of the list
    failed publishes nothing (before, a failed read counted as no list, and the new one dropped them), and one
    whose read found no list keeps those this key revoked before (KEY.revoked.json)."""
    from typer.testing import CliRunner

    from gradnode.node.cli import app

    key = tmp_path / "authority.key"
    key.write_bytes(keys["authority"].path.read_bytes())
    done = gradnode("run", "init", "--out", str(tmp_path / "run.json"), "--authority-key", str(key), *SETS)
    run_id = done.stdout.strip().removeprefix("run id: ")
    peer = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"]), load_or_create(tmp_path / "peer.key"))
    try:
        peer.start()
        for victims in ([keys["a"].peer_id], [keys["b"].peer_id]):  # the second call keeps the first one listed
            done = gradnode("revoke", *victims, "--genesis", str(tmp_path / "run.json"), "--authority-key", str(key),
                            "--initial-peer", peer.maddrs()[0])
            assert done.returncode == 0, done.stderr[-1500:]
        gate = Gate(run_id, keys["authority"].public_der, time.time)
        gate.take_revocations([raw for _, raw in peer.get(dht_key(run_id, "revocations"))])
        assert gate.revoked == {keys["a"].peer_id, keys["b"].peer_id}
        revoke_c = ["revoke", keys["c"].peer_id, "--genesis", str(tmp_path / "run.json"), "--authority-key", str(key),
                    "--initial-peer", peer.maddrs()[0]]
        monkeypatch.delenv("HIVEMIND_LOGLEVEL", raising=False)  # the command sets it: undone below
        monkeypatch.setattr(Transport, "read_expiring", lambda self, *args, **kw: None)  # the DHT read fails
        done = CliRunner().invoke(app, revoke_c)
        assert done.exit_code == 2 and "nothing was published" in done.output, done.output
        monkeypatch.setattr(Transport, "read_expiring", lambda self, *args, **kw: [])  # no list (expired, say)
        done = CliRunner().invoke(app, revoke_c)
        assert done.exit_code == 0, done.output
        monkeypatch.undo()
        gate = Gate(run_id, keys["authority"].public_der, time.time)
        gate.take_revocations([raw for _, raw in peer.get(dht_key(run_id, "revocations"), fresh=True)])
        assert gate.revoked == {keys["a"].peer_id, keys["b"].peer_id, keys["c"].peer_id}
        # revokes on a clock an hour behind the last one's (another machine's): hivemind keeps the later of two
        # expirations under one subkey, so a list stored for 30 days from this clock was refused, every time; and
        # the second of them too when the first outlived the one before by a guess at its expiration (a review's)
        behind = Transport.now
        monkeypatch.setattr(Transport, "now", lambda self: behind(self) - 3600.0)
        late = [load_or_create(tmp_path / f"{n}.key").peer_id for n in ("d", "e")]
        for victim in late:
            done = CliRunner().invoke(app, ["revoke", victim, *revoke_c[2:]])
            assert done.exit_code == 0, done.output
        monkeypatch.undo()
        gate.take_revocations([raw for _, raw in peer.get(dht_key(run_id, "revocations"), fresh=True)])
        assert set(late) <= gate.revoked
        # what cannot be published fails before anything is asked: a junk id, a broken file of kept revocations
        monkeypatch.delenv("HIVEMIND_LOGLEVEL", raising=False)
        done = CliRunner().invoke(app, [*revoke_c[:1], "QmNotAPeerId", *revoke_c[2:]])
        assert done.exit_code == 2 and "not a peer id: 'QmNotAPeerId'" in done.output, done.output
        (tmp_path / "authority.key.revoked.json").write_text('{"run": ["QmNotAPeerId"]}')
        done = CliRunner().invoke(app, revoke_c)
        assert done.exit_code == 2 and "authority.key.revoked.json is not a list" in done.output, done.output
    finally:
        peer.close()


@pytest.mark.swarm
def test_a_bootstrap_back_with_an_empty_dht_stores_the_revocations_again(keys, tmp_path: Path) -> None:
    """Real transports: the authority's list reaches a bootstrap, which keeps it in its folder; every DHT node
    stops; the bootstrap starts again with its folder and stores the list, and a peer joining it reads it
    (without the kept copy the DHT held none, and that peer admitted the revoked one again)."""
    auth, a = keys["authority"], keys["a"].peer_id
    key, path = dht_key(RUN, "revocations"), tmp_path / admission.KeptRevocations.FILE_NAME
    cert = admission.admit(auth, RUN, a, time.time() + 600)

    def start(name: str, initial: list[str]) -> Transport:
        t = Transport(SwarmConfig(host_maddrs=["/ip4/127.0.0.1/tcp/0"], initial_peers=initial),
                      auth if name == "authority" else load_or_create(tmp_path / f"{name}.key"))
        made.append(t)
        t.start()
        return t

    def within_a_minute(check) -> bool:  # a DHT read or store on a loaded machine can fail once: try again
        end = time.monotonic() + 60.0
        while not check() and time.monotonic() < end:
            time.sleep(0.5)
        return check()

    made: list[Transport] = []
    try:
        boot = start("boot", [])
        assert start("authority", boot.maddrs()).store(key, admission.revocation(auth, RUN, [a], time.time()), ttl=600)
        kept = admission.KeptRevocations(Gate(RUN, auth.public_der, boot.now), boot, path, every_s=0.0)
        assert within_a_minute(lambda: kept.refresh() or path.exists()) and kept.gate.revoked == {a}
        for t in made:
            t.close()
        made.clear()

        boot = start("boot", [])  # back with its folder, its DHT empty
        peer = start("peer", boot.maddrs())
        gate = Gate(RUN, auth.public_der, peer.now)
        gate.take_revocations([raw for _, raw in peer.get(key, fresh=True)])
        assert gate.why_not(a, cert) is None  # what a peer joining now read before: no list, a admitted
        kept = admission.KeptRevocations(Gate(RUN, auth.public_der, boot.now), boot, path, every_s=0.0)

        def revoked() -> bool:
            kept.refresh()
            gate.take_revocations([raw for _, raw in peer.get(key, fresh=True)])
            return gate.why_not(a, cert) == "admission revoked"

        assert within_a_minute(revoked)
    finally:
        for t in made:
            t.close()

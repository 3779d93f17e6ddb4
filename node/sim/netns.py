"""Real link caps for `gradnode simulate --bandwidth`: one network namespace per peer, tc tbf on its veth.

A token bucket inside the transport only paces the bytes gradnode itself writes; the kernel, TCP and
libp2p still see an infinitely fast loopback. Linux can do better when we are root: each peer runs in
its own network namespace, joined to one bridge on the host by a veth pair, and a `tbf` qdisc on both
ends of that pair caps what the peer sends (the namespace end) and what it receives (the host end).
The bootstrap stays on the host, on the bridge's own address, uncapped.

    host:  bridge gn<tag>br 10.231.N.1/24 ── gn<tag>h<i> (tbf: peer i's download)
    ns i:  gn<tag>ns<i>: gn<tag>n<i> 10.231.N.(10+i) (tbf: peer i's upload), lo

`<tag>` is this process's pid in hex plus a letter counting the `Links` made by it, so concurrent runs
never share a name; `N` is a /24 that no existing route or address overlaps. Everything is torn down
on exit, also after an error or Ctrl+C, and tearing down twice is harmless. Docker leaves the FORWARD
chain's policy at DROP while bridged frames pass through iptables (br_netfilter), so one ACCEPT rule
for the bridge is inserted and removed again.
"""

from __future__ import annotations

import fcntl
import functools
import ipaddress
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from gradnode.node.config import parse_rate

log = logging.getLogger(__name__)

_SEQ = itertools.count()  # Links made by this process: part of the names, so two never clash
_SEQ_LETTERS = "ghijklmnopqrstuvwxyz"  # not hex digits: the letter ends the pid unambiguously
_SUBNETS = ipaddress.ip_network("10.231.0.0/16")  # the /24s tried, starting at one picked by the pid
# serialises picking a /24 and claiming it; /run/lock is where Linux keeps lock files (the temp folder elsewhere)
_LOCK = (Path("/run/lock") if os.access("/run/lock", os.W_OK) else Path(tempfile.gettempdir())) / "gradnode-netns.lock"
_ROUTE_TYPES = ("unicast", "local", "broadcast", "multicast", "blackhole", "unreachable", "prohibit", "throw", "nat")
_MAX_PEERS = 200  # host .1, peers .10 upwards within one /24


class NetnsError(RuntimeError):
    """A command that builds or inspects the links failed; the message names the command."""


def _run(cmd: list[str]) -> str:
    """Run one command; on failure raise NetnsError naming it and quoting its stderr."""
    try:
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    except FileNotFoundError as err:
        raise NetnsError(f"`{' '.join(cmd)}` failed: {cmd[0]} not found") from err
    except subprocess.CalledProcessError as err:
        detail = (err.stderr or err.stdout or "").strip() or f"exit status {err.returncode}"
        raise NetnsError(f"`{' '.join(cmd)}` failed: {detail}") from None
    return done.stdout


def _try(cmd: list[str]) -> bool:
    """Run a teardown command; a failure (usually: already gone) is logged at debug level only."""
    try:
        _run(cmd)
        return True
    except NetnsError as err:
        log.debug("%s", err)
        return False


@functools.cache
def available() -> tuple[bool, str]:
    """Whether namespaces + tc tbf can be used here, and why not. Probed once per process for real
    (a namespace, a veth pair with tbf, all deleted again): being root is not enough inside some
    containers."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces need Linux"
    if os.geteuid() != 0:
        return False, "not running as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"`{tool}` not found (install iproute2)"
    probe = f"gnprobe{os.getpid():x}"
    try:
        _run(["ip", "netns", "add", probe])
        try:
            _run(["ip", "link", "add", f"{probe}a", "type", "veth", "peer", "name", f"{probe}b"])
            _run(["tc", "qdisc", "add", "dev", f"{probe}a", "root", *tbf_args("1mbit")])
        finally:
            _try(["ip", "link", "del", f"{probe}a"])
            _try(["ip", "netns", "del", probe])
    except NetnsError as err:
        return False, f"probe failed: {err}"
    return True, "root, ip and tc work"


def tbf_args(rate: str) -> list[str]:
    """tc arguments for a tbf cap at `rate` (any unit parse_rate reads). The bucket holds about 10 ms of
    traffic (at least 8 KB, over an MTU); packets wait at most 400 ms in the queue, then are dropped,
    which TCP reads as congestion, as on a real slow link."""
    bytes_per_s = parse_rate(rate)
    burst = max(8192, int(bytes_per_s * 0.01))
    return ["tbf", "rate", f"{int(bytes_per_s * 8)}bit", "burst", str(burst), "latency", "400ms"]


def _used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network a route or an address on this host covers (the default route excepted)."""
    nets = []
    for line in _run(["ip", "-4", "-o", "addr", "show"]).splitlines():
        words = line.split()
        if "inet" in words:
            nets.append(ipaddress.IPv4Network(words[words.index("inet") + 1], strict=False))
    for line in _run(["ip", "-4", "route", "show", "table", "all"]).splitlines():
        words = line.split()
        if words and words[0] in _ROUTE_TYPES:
            words = words[1:]
        if words and words[0] != "default":
            try:
                nets.append(ipaddress.IPv4Network(words[0], strict=False))
            except ValueError:
                pass
    return nets


def _free_subnet(start: int) -> ipaddress.IPv4Network:
    used = _used_networks()
    subnets = list(_SUBNETS.subnets(new_prefix=24))
    for k in range(len(subnets)):
        net = subnets[(start + k) % len(subnets)]
        if not any(net.overlaps(u) for u in used):
            return net
    raise NetnsError(f"no free /24 in {_SUBNETS}: every one overlaps a route or address of this host")


def _pids(ns: str) -> list[int]:
    """The processes in namespace `ns` (none if it is gone)."""
    try:
        return [int(p) for p in _run(["ip", "netns", "pids", ns]).split()]
    except NetnsError:
        return []


class _Made:
    """A context manager over namespaces: made on entry, all of them removed on exit, and removed at once
    when making them fails half-way (a half-made set must not outlive the run)."""

    def _create(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class Links(_Made):
    """`n_peers` capped links at `rate` each way; a context manager. After `__enter__`: `peers[i]` =
    (namespace, IPv4) of peer i, `host_ip` = the bridge's address (for the bootstrap). Processes in the
    namespaces must be stopped by their owner before exit; any still there are killed (and reported)
    so the veths go."""

    def __init__(self, n_peers: int, rate: str | None) -> None:
        if not 1 <= n_peers <= _MAX_PEERS:
            raise ValueError(f"Links: n_peers must lie in 1..{_MAX_PEERS}, got {n_peers}")
        self.n_peers = n_peers
        self.rate = rate  # None: links are not capped (namespaces for partitions only)
        self.tbf = tbf_args(rate) if rate is not None else None  # a bad rate fails here, before anything is made
        self._cuts: list[tuple[str, str]] = []  # (namespace, address) blackhole routes of a partition
        self.tag = f"{os.getpid():x}{_SEQ_LETTERS[next(_SEQ) % len(_SEQ_LETTERS)]}"
        self.bridge = f"gn{self.tag}br"
        self.peers: list[tuple[str, str]] = []
        self.host_ip = ""
        self._rule: list[str] | None = None  # the iptables rule, once inserted
        self._made: list[int] = []  # peer indices whose namespace exists
        self._bridge_made = False

    def ns(self, i: int) -> str:
        return f"gn{self.tag}ns{i}"

    def host_veth(self, i: int) -> str:
        return f"gn{self.tag}h{i}"

    def ns_veth(self, i: int) -> str:
        return f"gn{self.tag}n{i}"

    def names(self) -> list[str]:
        """Every namespace and interface name this run can create (to check that none is left)."""
        per_peer = [f(i) for i in range(self.n_peers) for f in (self.ns, self.host_veth, self.ns_veth)]
        return [self.bridge, *per_peer]

    def _create(self) -> None:
        with open(_LOCK, "a") as lock:  # another run must not pick the same /24 before we claim it
            fcntl.flock(lock, fcntl.LOCK_EX)
            net = _free_subnet(os.getpid())
            self._bridge_made = True
            _run(["ip", "link", "add", self.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{net[1]}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        self.host_ip = str(net[1])
        if shutil.which("iptables"):
            rule = ["FORWARD", "-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]
            _run(["iptables", "-w", "-I", *rule])
            self._rule = rule
        for i in range(self.n_peers):
            ip = str(net[10 + i])
            self._add_peer(i, ip)
            self.peers.append((self.ns(i), ip))
        log.info("links: %d namespaces on bridge %s (%s/24, host %s), %s", self.n_peers, self.bridge,
                 net.network_address, self.host_ip, f"tbf {self.rate} each way" if self.rate else "uncapped")

    def _add_peer(self, i: int, ip: str) -> None:
        ns, host, inner = self.ns(i), self.host_veth(i), self.ns_veth(i)
        _run(["ip", "netns", "add", ns])
        self._made.append(i)
        _run(["ip", "link", "add", host, "type", "veth", "peer", "name", inner])
        _run(["ip", "link", "set", inner, "netns", ns])
        _run(["ip", "link", "set", host, "master", self.bridge])
        _run(["ip", "link", "set", host, "up"])
        _run(["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", inner])
        _run(["ip", "-n", ns, "link", "set", inner, "up"])
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        if self.tbf is not None:
            _run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", inner, "root", *self.tbf])  # upload
            _run(["tc", "qdisc", "add", "dev", host, "root", *self.tbf])  # download

    def cut(self, groups: list[list[int]]) -> None:
        """Split the network into ``groups`` of peers: each peer's namespace gets a blackhole route to every
        peer of the other groups, and, outside the first group, to the bootstrap on the host; packets to
        them are dropped (both ways, since each side drops its replies), as on a broken link."""
        for k, group in enumerate(groups):
            away = [self.peers[j][1] for g in groups if g is not group for j in g] + ([self.host_ip] if k else [])
            for i in group:
                for ip in away:
                    _run(["ip", "-n", self.ns(i), "route", "add", "blackhole", f"{ip}/32"])
                    self._cuts.append((self.ns(i), ip))
        log.info("links: network split into %s", " | ".join(",".join(map(str, g)) for g in groups))

    def heal(self) -> None:
        """Remove the routes of ``cut``: one network again."""
        for ns, ip in self._cuts:
            _try(["ip", "-n", ns, "route", "del", "blackhole", f"{ip}/32"])
        self._cuts = []
        log.info("links: network healed")

    def exec_prefix(self, i: int) -> list[str]:
        """Prepended to a command to run it in peer i's namespace. `ip netns exec` execs the command
        (no fork), so the PID a caller gets from Popen is the command's own."""
        return ["ip", "netns", "exec", self.ns(i)]

    def close(self) -> None:
        """Remove everything, in the order that leaves nothing behind: processes, namespaces (their veth
        ends go with them), the host-side veths, the bridge, the iptables rule. Safe to call again."""
        self._wait_empty()
        for i in list(self._made):
            self._kill_leftovers(self.ns(i))
            _try(["ip", "netns", "del", self.ns(i)])
            if self._link_exists(self.host_veth(i)):
                _try(["ip", "link", "del", self.host_veth(i)])
            self._made.remove(i)
        if self._bridge_made:
            _try(["ip", "link", "del", self.bridge])
            self._bridge_made = False
        if self._rule is not None:
            _try(["iptables", "-w", "-D", *self._rule])
            self._rule = None

    def _wait_empty(self, timeout: float = 3.0) -> None:
        """Processes killed just before take a moment to exit, and helpers outside the peers' process
        groups (torch_shm_manager) leave once their clients are gone: give them that moment."""
        end = time.monotonic() + timeout
        while time.monotonic() < end and any(_pids(self.ns(i)) for i in self._made):
            time.sleep(0.1)

    @staticmethod
    def _kill_leftovers(ns: str) -> None:
        """A process still in the namespace keeps it (and its veth) alive after `ip netns del`. Only
        processes of this run can be in it; they are killed by PID and named in a warning."""
        for pid in _pids(ns):
            log.warning("links: pid %d was still in namespace %s; killing it", pid, ns)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    @staticmethod
    def _link_exists(name: str) -> bool:
        return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


class Hosts(_Made):
    """Two machines on one network, in spirit: two namespaces joined by one veth pair, no bridge and no way
    to the host (what a test of the README's two-machine commands runs in). A context manager; after
    ``__enter__``, ``ip[k]`` is host k's address (k = 0, 1). Processes in them must be stopped by their owner
    before exit; any still there are killed (and reported) so the namespaces go."""

    def __init__(self) -> None:
        self.tag = f"{os.getpid():x}{_SEQ_LETTERS[next(_SEQ) % len(_SEQ_LETTERS)]}"
        self.ip: list[str] = []
        self._made: list[str] = []

    def ns(self, k: int) -> str:
        return f"gn{self.tag}host{k}"

    def names(self) -> list[str]:
        """Every namespace and interface name this pair can create (to check that none is left)."""
        return [self.ns(0), self.ns(1), f"gn{self.tag}v0", f"gn{self.tag}v1"]

    def exec_prefix(self, k: int) -> list[str]:
        """Prepended to a command to run it on host k (`ip netns exec` execs it: Popen's pid is its own)."""
        return ["ip", "netns", "exec", self.ns(k)]

    def _create(self) -> None:
        with open(_LOCK, "a") as lock:  # the /24 is checked against the host's: claim it before another run does
            fcntl.flock(lock, fcntl.LOCK_EX)
            net = _free_subnet(os.getpid() + 1)
            for k in (0, 1):
                _run(["ip", "netns", "add", self.ns(k)])
                self._made.append(self.ns(k))
            v0, v1 = f"gn{self.tag}v0", f"gn{self.tag}v1"
            _run(["ip", "link", "add", v0, "netns", self.ns(0), "type", "veth", "peer", "name", v1, "netns", self.ns(1)])
            for k, veth in ((0, v0), (1, v1)):
                ip = str(net[1 + k])
                _run(["ip", "-n", self.ns(k), "addr", "add", f"{ip}/24", "dev", veth])
                _run(["ip", "-n", self.ns(k), "link", "set", veth, "up"])
                _run(["ip", "-n", self.ns(k), "link", "set", "lo", "up"])
                self.ip.append(ip)
        log.info("hosts: %s at %s and %s at %s", self.ns(0), self.ip[0], self.ns(1), self.ip[1])

    def close(self) -> None:
        """Stop what is left in the namespaces and delete them (the veth pair goes with them). Safe to call again."""
        end = time.monotonic() + 3.0
        while time.monotonic() < end and any(_pids(ns) for ns in self._made):
            time.sleep(0.1)
        for ns in list(self._made):
            Links._kill_leftovers(ns)
            _try(["ip", "netns", "del", ns])
            self._made.remove(ns)

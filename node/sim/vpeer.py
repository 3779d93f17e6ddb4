"""What one peer of the virtual simulator (node/sim/virtual.py) holds: its chain, its round cores, what reached
it, and its counters. One dataclass, which every part of the simulation reads and writes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from gradnode.node.sim import traffic
from gradnode.protocol import chain
from gradnode.protocol import committee
from gradnode.protocol import peer as peer_core
from gradnode.protocol.reputation import Reputation
from gradnode.protocol.roster import Roster
from gradnode.protocol.round import Report, RoundCore

TAIL = 4  # rounds of its chain a peer publishes (protocol/chain.py)


@dataclass
class VPeer:
    id: str
    slowness: float
    lie: str = ""  # its policy ('' honest)
    hashes: dict[int, str] = field(default_factory=lambda: {-1: committee.GENESIS})
    applied: dict[int, bytes] = field(default_factory=dict)
    cores: dict[int, RoundCore] = field(default_factory=dict)
    newest: int = -1  # max(cores): the newest round it opened
    # what the DHT holds for it, by round: every round event delivered to it, replayed into a round's core when
    # the round opens (a round re-opened after a re-sync reads the same records again: the DHT still holds them)
    records_of: dict[int, list[Any]] = field(default_factory=lambda: defaultdict(list))
    # the announcers among them, by round: each one's first sighting (the first Announced of it in records_of)
    announcers_of: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))
    reports_at: dict[int, dict[str, float]] = field(default_factory=lambda: defaultdict(dict))  # r -> witness -> came
    weights: dict[int, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))  # r -> peer -> hash
    # when the newest record (peer) and weight report ((peer, round)) it holds of each writer were written
    stamps: dict[Any, float] = field(default_factory=dict)
    # what reached it and waits for its next poll, by poll: (time, seq, writer or None, deliver) (_read_mail)
    mail: dict[int, list[tuple[float, int, Any, Callable[..., None]]]] = field(default_factory=dict)
    waiting: int | None = None  # the round it must apply before announcing the next one
    computed: int = -1  # newest round computed and not yet announced
    resyncs: int = 0
    busy_until: float = 0.0  # a re-sync's download
    gen: int = 0  # bumped by a re-sync: the compute in flight is of a round given up
    reported: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the senders its report listed
    sets: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the senders of the set it applied
    # q -> (when seen, its tail, the state it offers: its hashes and applied sets up to its newest round, the
    # round time it claims)
    records: dict[str, tuple[float, tuple[chain.Link, ...], Any, float]] = field(default_factory=dict)
    # the writers whose record changed since Simulation._sight last read ``records`` (it reads only those again)
    changed: set[str] = field(default_factory=set)
    sight: Any = None  # Simulation._sight's reading: [when a record of it expires, tails, rounds]; None: read all
    # the writers whose rounds in the sight changed since it was last read anew, in order, and how often it was
    # (Simulation._view brings its kept views up to date with them)
    moves: list[str] = field(default_factory=list)
    sight_epoch: int = 0
    views: dict[int, Any] = field(default_factory=dict)  # round -> the view of it kept (Simulation._view)
    cut: Any = None  # (what it was made of, the cut time) kept (Simulation._cut_at)
    offer: Any = None  # the state it offers now (one snapshot shared by its readers), rebuilt when it changes
    core: peer_core.PeerCore | None = None  # its rules between rounds (protocol/peer.py), made by Simulation
    # the hash check handed to the chores thread at the last apply, settled at the next
    chores: peer_core.HashChecked | None = None
    done: bool = False  # its last round is applied and checked: it stops its heartbeat
    final_gen: int = -1  # the state (gen) whose last round's check is scheduled
    alive: bool = True  # its process runs (churn: killed, stopped, or not joined yet)
    step_s: float = 0.0  # its seconds per inner step, measured in its last round (0 before it computed one)
    steps: dict[int, int] = field(default_factory=dict)  # round -> inner steps it ran for it
    abstained: set[int] = field(default_factory=set)  # rounds it sat out (too slow for their deadline)
    ledger: dict[str, int] = field(default_factory=dict)  # contributors: sender -> last round applied (shared state)
    pools: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> its ledger's keys (shared state)
    fetches: dict[int, committee.Fetches] = field(default_factory=dict)  # round -> which updates it fetches
    lists: dict[int, bool] = field(default_factory=dict)  # round -> it lists its record for it (roster.lists)
    roster: Roster = field(default_factory=Roster)  # its estimate of the swarm's size (committee runs)
    workers: dict[str, int] = field(default_factory=dict)  # sender -> newest round it verified and screened (memory)
    voters: frozenset[str] | None = None  # whose votes count (Simulation._revote); None: everyone's
    senders: frozenset[str] = frozenset()  # the senders of the last round it applied (whose records set the pace)
    counted: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the senders the aggregate counted
    reasons: dict[int, dict[str, str]] = field(default_factory=dict)  # round -> sender -> why the screens left it out
    reputation: Reputation = field(default_factory=Reputation)  # the robust rule's table (shared state)
    incarnation: int = 0  # bumped when its process dies or starts (its heartbeat belongs to one)
    # a liar's report of a round as it tells each reader (``Simulation._publish``): what it serves when asked too
    told: dict[int, Callable[["VPeer"], Report]] = field(default_factory=dict)
    traffic: traffic.Counters = field(default_factory=traffic.Counters)  # what it moved (``Simulation._fetch``)
    compute_from: dict[int, float] = field(default_factory=dict)  # round -> when its compute of it began
    members_read: float = 0.0  # the member records read up to this time (``Simulation._read_members``)
    holdings_at: tuple[int, float] = (-1, -1.0)  # (round, poll) of its last holdings write
    holdings_read: tuple[int, float] = (-1, -1.0)  # and of its last holdings read

    def hold(self, q: str, record: tuple[float, tuple[chain.Link, ...], Any, float]) -> None:
        """q's member record, as it reached this peer (its own: as it wrote it)."""
        self.records[q] = record
        self.changed.add(q)

    def forget(self, q: str) -> None:
        """q's member record is gone (q said it left)."""
        if self.records.pop(q, None) is not None:
            self.changed.add(q)

    def tail(self) -> tuple[chain.Link, ...]:
        return tuple((k, self.hashes[k]) for k in sorted(self.hashes)[-TAIL:] if k >= 0)

"""Is this peer in one swarm with the others? What `gradnode health` (and a compose healthcheck) reads.

A peer looks at the live training members it can see and groups them by the chain of states they
publish (protocol/chain.py). It is healthy while it follows the winning chain, sees at least
``swarm.expected_peers`` trainers (when set), and is not waiting for peers. The peer writes what it
found to ``health.json`` in its run folder every round and every heartbeat; `gradnode health` fails
when that file says so, or when it is older than a minute (a hung or dead peer).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Collection

from gradnode.node import write_json
from gradnode.protocol import chain, skew
from gradnode.protocol import peer as peer_core
from gradnode.protocol.chain import Link
from gradnode.protocol.records import MemberRecord

FILE_NAME = "health.json"


@dataclass
class ChainView:
    """The chains among the live trainers, as this peer sees them."""

    trainers: int = 1  # live training peers seen, this one included
    groups: int = 1  # chains among them
    on_winner: bool = True  # this peer follows the chain most of them follow
    winner_links: set[Link] = field(default_factory=set)  # the states that chain lists
    adoptable: set[Link] = field(default_factory=set)  # those more than half its peers list (chain.vouched)
    winners: list[str] = field(default_factory=list)  # the peers following it
    tie: bool = False  # this peer's chain is followed by as many peers as the winning one
    mine: int = 1  # peers following this peer's chain, itself included
    me: str = ""
    tails: dict[str, list[Link]] = field(default_factory=dict)  # the tails it was read from, by peer
    standing: chain.Standing = chain.Standing(True, False, (), 0)  # what the fork rule reads (chain.Follow)
    serving: frozenset[str] | None = None  # the peers that accept streams (a tie goes to their chain)

    def chains(self) -> peer_core.Chains:
        """What the peer core reads of this look (protocol/peer.py)."""
        return peer_core.Chains({p: tuple(t) for p, t in self.tails.items()}, self.serving)

    @property
    def allies(self) -> list[str]:
        """The other peers following this peer's chain (none while it published no tail)."""
        return chain.allies_since(self.tails, self.me, -1)

    def allies_since(self, round_: int) -> list[str]:
        """The allies that hold our state of ``round_`` or a later one (their tail and ours agree on a round
        at or after it): what they reported of ``round_`` is of a chain they left since, if it differs. One
        whose newest published round we share is older (a record a round behind) is no ally for ``round_``."""
        return chain.allies_since(self.tails, self.me, round_)


def chain_view(members: dict[str, MemberRecord], me: str, my_tail: list[Link],
               serving: Collection[str] | None = None) -> ChainView:
    """Group the live trainers (this peer with its own newest tail) by chain; see protocol/chain.py (given
    ``serving``, Membership.serving, a tie goes to a chain with a peer that serves its state first)."""
    tails = {p: list(m.chain) for p, m in members.items() if m.training and m.chain and p != me}
    if my_tail:
        tails[me] = list(my_tail)
    found = chain.groups(tails, serving)
    trainers = len({p for p, m in members.items() if m.training} | {me})
    serving = frozenset(serving) if serving is not None else None
    if not found:
        return ChainView(trainers=trainers, me=me, tails=tails, serving=serving)
    st = chain.standing(tails, me, serving)
    win = found[0]
    mine = next((g for g in found if me in g), [me])
    return ChainView(trainers=trainers, groups=len(found), on_winner=st.on_winner,
                     winner_links={link for p in win for link in tails[p]}, adoptable=chain.vouched(tails, win),
                     winners=win,
                     tie=me not in win and len(mine) == len(win), mine=len(mine),
                     me=me, tails=tails, standing=st, serving=serving)


def clock_words(clock: skew.Estimate) -> str:
    """This clock against the peers', and what to do when it is off."""
    side = "ahead of" if clock.ahead_s > 0 else "behind"
    words = (f"this machine's clock is {abs(clock.ahead_s):.1f} s (+-{clock.error_s:.1f}) {side} the swarm's (by "
             f"{clock.peers} peer{'s' if clock.peers > 1 else ''} pinged)")
    return f"{words}: sync it (NTP, e.g. `timedatectl set-ntp true`)" if clock.off() else words


def write(folder: Path, *, view: ChainView, round_: int, expected: int, waiting: bool,
          clock: skew.Estimate | None = None, finished: bool = False) -> None:
    """health.json for `gradnode health`, replaced atomically; ``clock``: this clock against the peers' (a clock off
    by more than the DHT allows is a reason of its own: it hides records or cuts rounds short)."""
    reasons = []
    if clock is not None and clock.off():
        reasons.append(clock_words(clock))
    if waiting:
        reasons.append("waiting for peers")
    if not view.on_winner:
        reasons.append(f"weights off the chain most peers follow ({view.groups} chains among "
                       f"{view.trainers} trainers)")
    if expected and view.trainers < expected:
        reasons.append(f"sees {view.trainers} of {expected} expected trainers")
    data = {"ok": not reasons, "reason": "; ".join(reasons) or "ok", "time": time.time(), "round": round_,
            "trainers": view.trainers, "expected": expected, "chains": view.groups, "on_winner": view.on_winner,
            "winners": view.winners[:8], "clock_ahead_s": None if clock is None else round(clock.ahead_s, 3),
            "finished": finished}
    try:
        write_json(folder / FILE_NAME, data)
    except OSError:  # a full disk must not stop training; the check then reports a stale file
        pass


def check(folder: Path, max_age_s: float = 60.0) -> tuple[bool, str]:
    """(healthy, one line why) from the health.json of a peer's run folder."""
    path = folder / FILE_NAME
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False, f"no readable {path} (the peer has not started, or is not a gradnode peer folder)"
    age = time.time() - float(data.get("time", 0.0))
    if data.get("finished"):
        return False, f"the peer ended at round {data.get('round')}, {age:.0f} s ago (it is not running)"
    if age > max_age_s:
        return False, f"{path} is {age:.0f} s old: the peer is hung or gone"
    return bool(data.get("ok")), f"round {data.get('round')}: {data.get('reason')} " \
                                 f"({data.get('trainers')} trainers seen, {data.get('chains')} chain(s))"

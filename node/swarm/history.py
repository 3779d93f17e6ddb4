"""What a peer knows about the rounds it applied: the weight hash after each, the updates it applied
and who made the newest one. The peer loop writes it when it applies a round, state sync when it
replays or adopts rounds, the chores thread reads it to report. (Who contributed lately, the next
rounds' witnesses and the voters, is shared state: the engine's contributors ledger.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from gradnode.protocol.chain import TAIL, Link


@dataclass
class RoundLog:
    hashes: dict[int, str] = field(default_factory=dict)  # round -> weight hash after applying it
    # round -> ((sender, digest) pairs applied, their total bytes); kept for the catch-up window, reported
    applied: dict[int, tuple[list[tuple[str, str]], int]] = field(default_factory=dict)
    senders: list[str] = field(default_factory=list)  # who made the newest round: they set the pace
    # round -> whose weight hashes of it count (committee.weighers: its drawn witnesses; None: every voter)
    weighers: dict[int, frozenset[str] | None] = field(default_factory=dict)
    trusted_from: int = 0  # rounds before this were replaced by a re-sync: their hash checks are moot

    def record(self, round_: int, param_hash: str, included: list[tuple[str, str]], update_bytes: int,
               weighers: frozenset[str] | None = None) -> None:
        self.hashes[round_] = param_hash
        self.applied[round_] = (included, update_bytes)
        self.weighers[round_] = weighers

    def newest_report(self) -> tuple[int, list[tuple[str, str]], int, str, str | None,
                                     frozenset[str] | None, frozenset[str] | None] | None:
        """(round, included, bytes, hash, hash of the round before, whose weight hashes count of it and of the
        round before) of the newest round applied here."""
        if not self.applied:
            return None
        last = max(self.applied)
        return (last, *self.applied[last], self.hashes[last], self.hashes.get(last - 1), self.weighers.get(last),
                self.weighers.get(last - 1))

    def tail(self) -> list[Link]:
        """The newest states this peer holds, oldest first: what its member record publishes."""
        hashes = dict(self.hashes)  # a copy: the chores thread reads while the peer loop writes
        return [(r, hashes[r]) for r in sorted(hashes)[-TAIL:] if r >= self.trusted_from]

    def forget_before(self, round_: int) -> None:
        for r in [r for r in self.applied if r < round_]:
            del self.applied[r]
        for r in [r for r in self.weighers if r < round_ - 1]:  # the round before the oldest kept is checked
            del self.weighers[r]

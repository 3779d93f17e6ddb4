"""Reputation: a per-sender table that is a pure function of the decided rounds, so every peer holds the same.

Each round the robust rule (protocol/robust.py) screens the decided updates; a *strike* is an update left
out as a replay or for its direction (the others' mean contradicts it). A sender's score moves towards 0
on a strike and towards 1 otherwise:

    score <- DECAY * score + (1 - DECAY) * (0 if strike else 1)        (unknown senders start at 1)

and while its score is below BAN_BELOW its updates get weight 0. Why it helps: the per-round screens
only see one round, so an attacker that is caught most rounds but slips through in some (a lazy or
noisy peer near the threshold, one that attacks in bursts) still gets in then; with DECAY 0.7 two
strikes in a row take a sender out (0.49) until it sends updates the others agree with again (one such
round lifts 0.49 to 0.64; a sender struck 4 times in a row needs 2). An honest peer struck once by
chance keeps its weight (0.7). Its direction is still judged while it is out, so recovery needs no
one's permission. Duplicates are never struck (the copy cannot be told from the original there).

Newcomers: a strike counts only against a sender the ledger of contributors (the shared state's record
of whose updates counted in the last 64 rounds) holds, or one already in this table. An honest peer's
first updates after joining (a partial round of a few steps, no error feedback yet, a fresh AdamW) point
weakly: the direction screen leaves them out (their content goes back to the sender's error feedback),
and two such rounds used to ban a new peer for two more. A sender the rule never let in has no weight to
lose, and every round's screen still applies to it; once one of its updates counted, strikes count.
(A key that never got in can be replaced by a fresh one in an open run anyway.)

The table also keeps the fingerprints of the last round's updates, against which the next round's are
checked for replays. Everything is Python floats and sorted keys: ``after`` gives the same table on
every peer that applied the same rounds, and ``to_dict`` / ``from_dict`` round-trip it exactly (JSON).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gradnode.protocol.screening import Screen

DECAY = 0.7
BAN_BELOW = 0.5
FORGET_ABOVE = 0.99  # a score back above this is dropped from the table (as good as unknown)
MAX_SENDERS = 100_000  # the table never grows beyond this many entries (the worst scores are kept)
MAX_RECENT = 4096  # fingerprints kept from the last round


@dataclass(frozen=True)
class Reputation:
    """Scores of senders with a recent strike (absent = 1.0) and the last round's update fingerprints."""

    scores: Mapping[str, float] = field(default_factory=dict)
    recent: frozenset[bytes] = frozenset()

    def score(self, sender: str) -> float:
        return self.scores.get(sender, 1.0)

    def weight(self, sender: str) -> float:
        """The multiplier the robust rule applies to this sender's updates: 0 while banned, else 1."""
        return 0.0 if self.score(sender) < BAN_BELOW else 1.0

    def weights(self) -> dict[str, float]:
        """sender -> weight for every sender in the table (``robust_aggregate(reputation=...)``)."""
        return {s: self.weight(s) for s in sorted(self.scores)}

    def banned(self) -> list[str]:
        return [s for s in sorted(self.scores) if self.weight(s) == 0.0]

    def after(self, screens: Iterable[Screen], established: Collection[str] | None = None) -> "Reputation":
        """The table after one decided round, given the rule's screens of its updates. ``established``: the
        senders with a counted update in the shared contributors ledger; when given, a strike counts only
        against them and senders already in the table (see the module docstring: newcomers)."""
        screens = list(screens)
        scores = dict(self.scores)
        struck: dict[str, bool] = {}
        for s in screens:  # one outcome per sender and round: struck if any of its updates was
            judged = established is None or s.sender in established or s.sender in scores
            struck[s.sender] = struck.get(s.sender, False) or (s.strike and judged)
        for sender in sorted(struck):
            new = DECAY * scores.get(sender, 1.0) + (1.0 - DECAY) * (0.0 if struck[sender] else 1.0)
            if new > FORGET_ABOVE:
                scores.pop(sender, None)
            else:
                scores[sender] = new
        if len(scores) > MAX_SENDERS:
            keep = sorted(scores.items(), key=lambda kv: (kv[1], kv[0]))[:MAX_SENDERS]
            scores = dict(keep)
        recent = sorted({s.fingerprint for s in screens})[:MAX_RECENT]
        return Reputation(dict(sorted(scores.items())), frozenset(recent))

    def to_dict(self) -> dict[str, Any]:
        """JSON types only: {"scores": {sender: score}, "recent": [hex fingerprints, sorted]}."""
        return {"scores": dict(sorted(self.scores.items())), "recent": sorted(f.hex() for f in self.recent)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Reputation":
        """The inverse of to_dict; a malformed table (from a peer's state) raises ValueError."""
        if not isinstance(data, Mapping) or set(data) != {"scores", "recent"}:
            raise ValueError("reputation must be a map with exactly the keys 'recent' and 'scores'")
        scores, recent = data["scores"], data["recent"]
        if not isinstance(scores, Mapping) or len(scores) > MAX_SENDERS:
            raise ValueError(f"reputation scores must be a map of at most {MAX_SENDERS} senders")
        if not isinstance(recent, list) or len(recent) > MAX_RECENT:
            raise ValueError(f"reputation recent must be a list of at most {MAX_RECENT} fingerprints")
        out: dict[str, float] = {}
        for sender, score in scores.items():
            if not isinstance(sender, str) or len(sender) > 256 or type(score) is not float or not 0.0 <= score <= 1.0:
                raise ValueError(f"reputation score of {sender!r} must be a float in [0, 1]")
            out[sender] = score
        fps = set()
        for f in recent:
            if not isinstance(f, str) or len(f) != 64:
                raise ValueError("reputation fingerprints must be 64 hex digits")
            try:
                fps.add(bytes.fromhex(f))
            except ValueError:
                raise ValueError("reputation fingerprints must be 64 hex digits") from None
        return cls(dict(sorted(out.items())), frozenset(fps))

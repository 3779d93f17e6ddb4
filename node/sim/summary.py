"""The virtual simulator's result (node/sim/virtual.py): the JSON summary of a run, and its printed form.
``Summary`` is a part of ``virtual.Simulation``.

Safety is checked after every applied round (``virtual.Simulation._apply``); here are its findings. Censorship,
counted at the end: an honest update that every honest peer verified before it reported, yet left out of an
honest peer's decided set (``kept_out``). Liveness (``rounds_to_converge``): the rounds it takes after a
violation until every honest peer holds one hash, or with a partition, after its heal (the newest round a peer
adopted a state of, past ``heal_at``); None when the run ends on two hashes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

from gradnode.node.sim import traffic


class Summary:
    """What a run found, as one JSON object."""
    def _kept_out(self) -> int:
        """Honest updates every honest peer listed in its own report of a round, missing from an honest peer's
        applied set of it (a re-synced peer's adopted rounds are the donor's: not counted twice)."""
        honest = [p for p in self.peers.values() if not p.lie]
        out = 0
        for r in range(self.sc.rounds):
            listed = [p.reported.get(r) for p in honest]
            if not listed or any(x is None for x in listed):
                continue
            everyone = frozenset.intersection(*listed) & {p.id for p in honest}
            out += sum(len(everyone - p.sets[r]) for p in honest if r in p.sets)
        return out

    def _summary(self, wall: float) -> dict[str, Any]:
        last = self.sc.rounds - 1
        final = Counter(p.hashes.get(last, "") for p in self.peers.values() if not p.lie and p.alive)
        liars = {p.id for p in self.peers.values() if p.lie}
        # per peer, the honest peer-rounds whose applied set listed its update, and whose aggregate counted it
        applied, counted = Counter(), Counter()
        for p in self.peers.values():
            if not p.lie:
                for senders in p.sets.values():
                    applied.update(senders)
                for senders in p.counted.values():
                    counted.update(senders)
        # liveness: how many rounds past a split's round the last of its peers re-synced onto the majority, or
        # with a partition, past the heal (None: the run ended on more than one hash)
        converged = max(self.repairs, default=0) if len(final) == 1 and not self.stalled else None
        if converged is not None and self.sc.partition and (self.sc.heal_at >= 0 or self.sc.heal_after_s >= 0):
            healed = self.sc.heal_at if self.sc.heal_after_s < 0 else self.healed_round
            converged = max([a - healed for a in self.adopted] + [0])
        if converged is not None and self.swizzled:  # rounds from the last link's unclogging on
            converged = max([a - self.unclog_round for a in self.adopted] + [0]) if self.unclog_round >= 0 else None
        return {"seed": self.sc.seed, "peers": self.sc.peers, "rounds": self.sc.rounds,
                "violations": self.violations, "splits": len({v["round"] for v in self.violations}),
                "rounds_to_converge": converged, "final_hashes": len(final),
                "resyncs": sum(p.resyncs for p in self.peers.values() if not p.lie), "undecided": self.undecided,
                "waited_out": self.waited_out, "no_offer": self.no_offer, "downloads": self.downloads,
                "catchups": self.catchups, "far_states": self.far_states, "made_up": self.made_up,
                "abstained": self.abstained, "cut_short": self.cut_short,
                "contributed": {q: applied[q] for q in self.peers},
                "kept_out": self._kept_out(),
                "liar_rounds": sum(bool(liars & p.sets[r]) for p in self.peers.values() if not p.lie for r in p.sets),
                "counted": {q: counted[q] for q in self.peers},
                # honest updates in an honest peer's applied set that its aggregate did not count
                "honest_screened": sum(len(p.sets[r] - p.counted[r] - liars) for p in self.peers.values()
                                       if not p.lie for r in p.counted),
                # why the screens left a liar's update out, over the honest peers' applied sets
                "liar_screens": dict(sorted(Counter(why for p in self.peers.values() if not p.lie
                                                    for r in p.reasons for q, why in p.reasons[r].items()
                                                    if q in liars).items())),
                "traffic": traffic.summary(p.traffic.row() for p in self.peers.values() if not p.lie),
                "stalled": self.stalled, "per_round": [{"round": r, **self.per_round[r]} for r in sorted(self.per_round)],
                "events": self.events, "virtual_s": round(self.now, 3), "wall_s": round(wall, 3),
                "scenario": {k: v for k, v in asdict(self.sc).items() if k != "params"}}


def print_summary(out: dict[str, Any]) -> None:
    """Per round: how many peers applied it, how many applied another set than the first peer on their chain
    (0 when safe), and the re-syncs that found it off the majority; then the totals."""
    print(f"virtual swarm: {out['peers']} peers, {out['rounds']} rounds, seed {out['seed']}")
    print(f"{'round':>5} {'applied':>8} {'violations':>10} {'resyncs':>8}")
    for row in out["per_round"]:
        print(f"{row['round']:>5} {row['applied']:>8} {row['violations']:>10} {row['resyncs']:>8}")
    sc = out["scenario"]
    if sc["partition"]:
        heal = f"healed at round {sc['heal_at']}" if sc["heal_at"] >= 0 else "never healed"
        print(f"partition {'|'.join(','.join(map(str, g)) for g in sc['partition'])} from round {sc['partition_at']}, "
              f"{heal} (each side trains on; the rounds to converge count from the heal)")
    if out["scenario"]["liars"]:
        print(f"liars {', '.join(f'{i}:{k}' for i, k in out['scenario']['liars'])}: honest updates kept out "
              f"{out['kept_out']}; peer-rounds that applied a liar's update {out['liar_rounds']}, that counted it "
              f"(the robust rule's screens) {', '.join(str(out['counted'][f'p{i:04d}']) for i, _ in out['scenario']['liars'])}; "
              f"honest updates screened out {out['honest_screened']}")
    if any(k == "futurestate" for _, k in sc["liars"]):
        print(f"states a liar made up that a peer adopted: {out['made_up']} ({out['far_states']} past the run's end)")
    if sc["swizzle_at"] >= 0:
        print(f"swizzle-clogging from round {sc['swizzle_at']}: a link clogs every {sc['swizzle_s']:g} s, then they "
              f"unclog (the rounds to converge count from the last)")
    if sc["drift_s"] or sc["clock_off"]:
        print(f"clocks off: up to {sc['drift_s']:g} s each" + "".join(f", peer {i} by {d:+g} s" for i, d in sc["clock_off"]))
    if sc["slow"]:
        print(f"stragglers {', '.join(f'{i}x{f:g}' for i, f in sc['slow'])}: rounds in the applied sets "
              f"{', '.join(str(out['contributed'][f'p{i:04d}'] // max(1, out['peers'] - len(sc['liars']))) for i, _ in sc['slow'])}"
              f" of {out['rounds']}; honest peer-rounds sat out {out['abstained']}, cut short {out['cut_short']}")
    print(f"violations {len(out['violations'])} in {out['splits']} rounds; re-syncs {out['resyncs']}; "
          f"final hashes {out['final_hashes']}; rounds to converge {out['rounds_to_converge']}; "
          f"{out['events']} events, {out['virtual_s']:.0f} virtual s in {out['wall_s']:.2f} s"
          + ("; STALLED" if out["stalled"] else ""))

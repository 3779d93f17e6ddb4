"""Witnesses caught signing two different reports for one round.

A witness report is final once published: the DHT keeps only a witness's latest record, so a witness that
rewrites its report while peers are counting has them count different versions. Two signed reports of
one witness for one round and chain with different contents (an abstention included:
records.report_digest) prove it. A peer reads every round's reports at least twice (at the deadline and
before applying it, agreement.py), so one that keeps rewriting is seen with both versions. The peer that
holds both serves them and says so in a run-wide ``equivocations`` record; every peer that reads the
record fetches both, checks the accused's signatures itself, and from then on never counts that witness
and ignores its updates (so the decided chain soon leaves it out of the eligible witnesses for everyone
alike). A record costs its reader one fetch of two small records at most once; a false one proves
nothing and bans nobody.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from gradnode.node import write_json
from gradnode.node.swarm import events
from gradnode.node.swarm.events import Kind
from gradnode.node.swarm.membership import Membership
from gradnode.protocol.records import MAX_RECORD_BYTES, Equivocation, RecordError, Report, report_digest

log = logging.getLogger(__name__)

REPORT_TTL_S = 7 * 24 * 3600.0  # a record outlives the run's joiners: peers arriving later ban the same key
CHECKS_PER_REFRESH = 8  # equivocation records fetched and checked per refresh (each costs one fetch)
CHECKED_KEPT = 4096  # equivocation records remembered as checked (older ones may be checked again)


def evidence_name(run_id: str, round_: int, witness: str, digest: str) -> str:
    """Blob under which a reporter serves one of the two signed reports (kept for the whole run)."""
    return f"e/{run_id}/{round_}/{witness}/{digest}"


class Equivocators:
    """The witnesses this peer holds proof against, each with the round it was caught in."""

    def __init__(self, members: Membership, run_id: str, path: Path | None = None) -> None:
        self.members, self.run_id, self.path = members, run_id, path
        self.banned: dict[str, int] = {}
        self._checked: dict[tuple[str, int, str, str], None] = {}  # records checked, oldest first
        self._lock = threading.Lock()
        if path is not None and path.exists():  # a restart keeps what it proved: the proofs may be gone
            try:
                self.banned = {str(p): int(r) for p, r in json.loads(path.read_text()).items()}
            except (ValueError, TypeError, AttributeError, OSError) as err:
                log.warning("%s unreadable (%s): starting without bans", path, err)

    def __contains__(self, peer: str) -> bool:
        with self._lock:
            return peer in self.banned

    def peers(self) -> list[str]:
        with self._lock:
            return sorted(self.banned)

    def proven(self, a: Report, b: Report) -> bool:
        """``a`` and ``b`` are verified records (membership.read or check): same witness and round, same base
        (chain) or one an abstention (a peer that sits a round out reports nothing on it, on any chain: it
        does not know yet which state the round starts from), different contents; never this peer's own (a
        stale replica of it)."""
        return a.witness == b.witness != self.members.identity.peer_id and a.round == b.round \
            and (a.base == b.base or a.abstain or b.abstain) and report_digest(a) != report_digest(b)

    def caught(self, a: Report, b: Report) -> None:
        """Ban ``a.witness`` on the proof ``a``, ``b``, serve both and say so (once)."""
        if not self.proven(a, b):
            return
        with self._lock:
            if a.witness in self.banned:
                return
            self.banned[a.witness] = a.round
            banned = dict(self.banned)
        if self.path is not None:
            try:
                write_json(self.path, banned)
            except OSError as err:
                log.warning("bans not saved to %s: %s", self.path, err)
        first, second = sorted((a, b), key=report_digest)
        for p in (first, second):
            self.members.transport.blobs.put(evidence_name(self.run_id, p.round, p.witness, report_digest(p)),
                                             p.to_bytes())
        self.members.write("equivocations", None, Equivocation(
            run_id=self.run_id, round=a.round, reporter=self.members.identity.peer_id, accused=a.witness,
            first=report_digest(first), second=report_digest(second)), ttl=REPORT_TTL_S)
        log.warning("witness=%s equivocated in round=%d (two signed reports %s, %s): never counted again",
                    a.witness[:12], a.round, report_digest(first)[:8], report_digest(second)[:8],
                    extra=events.tag(Kind.EQUIVOCATION, peer=a.witness))

    def check(self, data: bytes, witness: str, round_: int, digest: str, signed: bool = True) -> Report | None:
        """``data`` as ``witness``'s signed report for ``round_`` with ``digest``, or None. ``signed=False``: its
        form only (what the fetch checks: a signature check may read the DHT for a key, and a holder whose
        bytes fail is not asked again)."""
        try:
            p = Report.from_bytes(data)
        except RecordError:
            return None
        ok = p.witness == witness and p.round == round_ and report_digest(p) == digest \
            and (not signed or self.members.verify_record(p))
        return p if ok else None

    def refresh(self) -> None:
        """Read the run's equivocation records and check a few not checked yet: only records by peers whose
        votes count (recent contributors) against members whose key is known, each fetch bounded, so a
        flood of records by keys made in bulk costs nothing and a lying reporter one fetch."""
        votes, members = self.members.votes(), self.members.members()
        todo = []
        for rep in self.members.read("equivocations", None, Equivocation):
            key = (rep.accused, rep.round, rep.first, rep.second)
            if rep.accused in self or key in self._checked or rep.first == rep.second or not votes(rep.reporter) \
                    or rep.accused not in members or rep.reporter not in members:
                continue
            todo.append((rep, key))
        for rep, key in todo[:CHECKS_PER_REFRESH]:
            self._checked[key] = None
            while len(self._checked) > CHECKED_KEPT:
                del self._checked[next(iter(self._checked))]
            first = self._fetch(rep.reporter, rep.accused, rep.round, rep.first)
            second = None if first is None else self._fetch(rep.reporter, rep.accused, rep.round, rep.second)
            if first is not None and second is not None:
                self.caught(first, second)
            else:
                log.info("equivocation record by %s against %s unproven", rep.reporter[:12], rep.accused[:12])

    def watch(self, stop: threading.Event, every_s: float = 2.0) -> None:
        """Check equivocation records every ``every_s`` seconds on a thread of its own until ``stop``."""
        def loop() -> None:
            while not stop.wait(every_s):
                try:
                    self.refresh()
                except Exception as err:  # a DHT hiccup must not end the watch
                    log.debug("equivocation records unread: %r", err)
        threading.Thread(target=loop, name="equivocations", daemon=True).start()

    def _fetch(self, holder: str, witness: str, round_: int, digest: str) -> Report | None:
        name = evidence_name(self.run_id, round_, witness, digest)
        data = self.members.transport.fetch(self.members.sources([holder]), name, max_bytes=MAX_RECORD_BYTES,
                                            deadline=time.monotonic() + 2.0,
                                            verify=lambda d: self.check(d, witness, round_, digest, signed=False)
                                            is not None)
        return None if data is None else self.check(data, witness, round_, digest)


class OwnReports:
    """The (round, base) pairs this peer signed a report for (base '' for an abstention), kept on disk: a peer
    killed after reporting and back within the same round must not sign a second, different one (that is
    equivocation, and others would ban it for good). Such a peer reports nothing more for that round."""

    KEEP = 8

    def __init__(self, path: Path) -> None:
        self.path = path

    def _done(self) -> list[tuple]:
        """The (round, base) pairs noted so far ([] when the file is missing or unreadable)."""
        try:
            return [tuple(x) for x in json.loads(self.path.read_text())]
        except (OSError, ValueError, TypeError):
            return []

    def first(self, round_: int, base: str) -> bool:
        """True, and noted, unless this peer already reported on ``round_`` on the chain ``base`` names, or sat
        it out; False too when the note cannot be written (a restart within this round could then sign a
        second report and be banned for good: one report less costs one vote)."""
        done = self._done()
        if (round_, base) in done or (round_, "") in done:
            log.info("round=%d: reported on it (or sat it out) before a restart; not reporting again", round_)
            return False
        return self._note(done, round_, base)

    def abstaining(self, round_: int) -> bool:
        """True, and noted, unless this peer reported on ``round_`` already (then it says nothing more)."""
        done = self._done()
        if any(r == round_ for r, *_ in done):
            return False
        return self._note(done, round_, "")

    def _note(self, done: list[tuple], round_: int, base: str) -> bool:
        try:
            write_json(self.path, [*done[-(self.KEEP - 1):], (round_, base)])
        except OSError as err:
            log.warning("own reports not saved to %s (%s): not reporting on round=%d", self.path, err, round_)
            return False
        return True

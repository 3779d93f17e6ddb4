"""What a peer tells the operator about its own run while it runs: Prometheus metrics on a port of its own
(``metrics.port``), and optionally the per-round rows in TensorBoard or Weights & Biases.

Values are read at scrape time from the peer's own counters (``Gauges``, filled in by the peer every round,
every heartbeat, and by a scrape at most once a second), so a scrape never waits on the training loop.
Every figure here is this peer's own view.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from gradnode.node.config import ConfigError, MetricsConfig
from gradnode.node.swarm.report import Tally

log = logging.getLogger(__name__)


class Role(enum.Enum):
    """What a peer does: train, or only serve the swarm (a serve-only bootstrap)."""

    TRAIN = "train"
    SERVE = "serve"


@dataclass
class Gauges:
    """The peer's latest figures, written by its threads, read by the exporter; its counters (resyncs,
    contributed rounds, seconds in inner steps, ...) are read straight from its ``Tally``."""

    role: Role = Role.TRAIN
    round: int = 0  # rounds applied (the engine's round); for a serve-only peer the newest round it saw
    train_loss: float | None = None
    val_loss: float | None = None
    tokens_per_s: float = 0.0
    training_since: float | None = None  # monotonic time the training loop started
    tally: Tally = field(default_factory=Tally)  # the peer's counters, read at scrape time
    peers_seen: dict[Role, int] = field(default_factory=dict)  # live members in sight, by role
    waiting_for_peers: bool = False
    hash_agrees: bool | None = None  # None: not checked yet
    bad_records: int = 0  # DHT records that failed their schema or signature (Membership.bad_records)
    rejected: Callable[[], dict[str, dict[str, int]]] = dict  # Rejections.by_sender
    traffic: Callable[[], tuple[int, int]] = lambda: (0, 0)  # (bytes sent, bytes received)
    refresh: Callable[[], None] | None = None  # the peer's way to fill these in; a scrape calls it
    refreshed: float = 0.0  # monotonic time of the last refresh by a scrape

    def maybe_refresh(self, min_interval: float = 1.0) -> None:
        """Fill the figures in before a scrape; at most once per ``min_interval`` (scrapes may come in
        floods; the peer's membership view is cached for a moment anyway)."""
        if self.refresh is None or time.monotonic() - self.refreshed < min_interval:
            return
        self.refreshed = time.monotonic()
        try:
            self.refresh()
        except Exception as err:  # a DHT hiccup: serve the last figures
            log.debug("metrics refresh failed: %r", err)

    def utilization(self) -> float:
        if self.training_since is None:
            return 0.0
        wall = time.monotonic() - self.training_since
        return min(1.0, self.tally.inner_s / wall) if wall > 0 else 0.0


class _Collector:
    """A prometheus_client collector over ``Gauges`` (values read at scrape time)."""

    def __init__(self, g: Gauges, run_id: str, peer_id: str, version: str) -> None:
        self.g, self.labels = g, {"run": run_id, "peer": peer_id, "version": version}

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

        g = self.g
        g.maybe_refresh()
        t = g.tally
        yield InfoMetricFamily("gradnode_peer", "This peer: run, peer id, software version, role.",
                               value={**self.labels, "role": g.role.value})

        def gauge(name: str, doc: str, value: float | None) -> Iterator[Any]:
            if value is not None:
                yield GaugeMetricFamily(f"gradnode_{name}", doc, value=float(value))

        def counter(name: str, doc: str, value: float) -> Any:
            return CounterMetricFamily(f"gradnode_{name}", doc, value=float(value))

        yield from gauge("round", "Rounds applied by this peer (a serve-only peer: the newest round it saw).", g.round)
        yield from gauge("train_loss", "Mean training loss of this peer's last inner round.", g.train_loss)
        yield from gauge("val_loss", "Validation loss at the last evaluation (metrics.eval_every).", g.val_loss)
        if g.role is Role.TRAIN:
            yield from gauge("tokens_per_second", "Tokens per second of the inner steps.", g.tokens_per_s)
            yield from gauge("compute_utilization", "Share of wall time in inner steps since training started.",
                             g.utilization())
            yield counter("wait_seconds", "Seconds the training loop waited for round outcomes.", t.wait_s)
            yield from gauge("waiting_for_peers", "1 while the peer waits for enough trainers to start.",
                             int(g.waiting_for_peers))
            yield from gauge("hash_agrees", "1 when this peer's weights follow the chain most live trainers "
                                            "follow, 0 when not.", None if g.hash_agrees is None else int(g.hash_agrees))
            yield counter("resyncs", "Full state re-syncs (hash mismatch, fork, catch-up).", t.resyncs)
            yield counter("catchups", "Missed rounds caught up by replaying their updates.", t.catchups)
            yield counter("state_downloads", "Full states downloaded from peers.", t.sync["downloads"])
            yield counter("rounds_contributed", "Rounds whose agreed set held this peer's update.", t.contributed)
            yield counter("rounds_excluded", "Rounds whose agreed set left this peer's update out.", t.own_excluded)
            yield counter("rounds_abstained", "Rounds sat out to get back in phase.", t.abstained)
        up, down = g.traffic()
        yield counter("sent_bytes", "Bytes sent over libp2p streams (updates, state).", up)
        yield counter("received_bytes", "Bytes received over libp2p streams.", down)
        seen = GaugeMetricFamily("gradnode_peers_seen", "Live members in sight, by role.", labels=["role"])
        for role in Role:
            seen.add_metric([role.value], g.peers_seen.get(role, 0))
        yield seen
        from gradnode.node.swarm.rules import REASONS

        reasons = dict.fromkeys(REASONS, 0)  # every reason from the start, so rates work from the first scrape
        for counts in g.rejected().values():
            for reason, n in counts.items():
                reasons[reason] = reasons.get(reason, 0) + n
        rejected = CounterMetricFamily("gradnode_rejected_updates", "Updates rejected, by reason.", labels=["reason"])
        for reason, n in sorted(reasons.items()):
            rejected.add_metric([reason], n)
        yield rejected
        yield counter("rejected_records", "DHT records dropped for a bad schema, signature or author.", g.bad_records)


class Exporter:
    """Serves ``Gauges`` at http://host:port/metrics while the peer runs (nothing when metrics.port is 0)."""

    def __init__(self, cfg: MetricsConfig, gauges: Gauges, run_id: str, peer_id: str, version: str) -> None:
        self.cfg, self.gauges = cfg, gauges
        self.collector = _Collector(gauges, run_id, peer_id, version)
        self._server: Any = None

    def start(self) -> None:
        if not self.cfg.port:
            return
        from prometheus_client import CollectorRegistry, start_http_server

        registry = CollectorRegistry(auto_describe=True)
        registry.register(self.collector)
        try:
            self._server, _thread = start_http_server(self.cfg.port, addr=self.cfg.host, registry=registry)
        except OSError as err:
            raise ConfigError(f"metrics.port: cannot listen on {self.cfg.host}:{self.cfg.port} "
                              f"({err.strerror or err}); pick a free port or 0 (off)") from None
        log.info("metrics at http://%s:%d/metrics", self.cfg.host, self.cfg.port)

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class RoundSinks:
    """The per-round metrics rows, also as TensorBoard scalars and W&B logs when configured (optional
    extras; neither needs an account by default: W&B runs offline unless metrics.wandb_mode says online)."""

    SCALARS = ("loss", "val_loss", "wait_s", "bytes_up", "bytes_down", "rejected", "resyncs", "applied",
               "tokens", "utilization")

    def __init__(self, cfg: MetricsConfig, run_id: str, peer_id: str) -> None:
        self._tb: Any = None
        self._wandb: Any = None
        self._lock = threading.Lock()
        if cfg.tensorboard_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("metrics.tensorboard_dir needs TensorBoard: pip install 'gradnode[tensorboard]'") \
                    from None
            self._tb = SummaryWriter(log_dir=str(cfg.tensorboard_dir / peer_id[:16]))
        if cfg.wandb_project is not None:
            try:
                import wandb
            except ImportError:
                raise ConfigError("metrics.wandb_project needs wandb: pip install 'gradnode[wandb]'") from None
            self._wandb = wandb.init(project=cfg.wandb_project, mode=cfg.wandb_mode, group=run_id,
                                     name=peer_id[:16], config={"run_id": run_id, "peer_id": peer_id})

    def log(self, row: dict[str, Any]) -> None:
        scalars = {k: float(row[k]) for k in self.SCALARS if isinstance(row.get(k), (int, float))}
        step = int(row["round"])
        with self._lock:
            if self._tb is not None:
                for k, v in scalars.items():
                    self._tb.add_scalar(k, v, step)
                self._tb.flush()
            if self._wandb is not None:
                self._wandb.log(scalars, step=step, commit=True)

    def close(self) -> None:
        with self._lock:
            if self._tb is not None:
                self._tb.close()
                self._tb = None
            if self._wandb is not None:
                self._wandb.finish()
                self._wandb = None

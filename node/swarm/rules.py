"""What an update must be to count in this run, checked in the order that costs an attacker the most.

Every update that arrives (fetched, pushed, or replayed in a catch-up) is a claim by someone who may lie.
``UpdateRules.check`` accepts it only when, in this order:

1. it is signed by the sender its name says, checked on the raw bytes (a digest of at most
   ``swarm.max_update_bytes``) *before* anything is decompressed or allocated, so an unsigned or forged
   decompression bomb costs the receiver one hash;
2. its envelope decodes within the bounds of the run's tensors (names, shapes, sizes);
3. the sender, run and round inside match where it came from;
4. its codec is exactly the run's (a dense update in a sparse run is refused: 100x the bytes, and a
   different influence per coordinate);
5. the tokens it declares do not exceed what the run's config allows one peer in one round
   (``inner.steps x inner.batch_size x inner.grad_accum x model.seq_len``). Tokens set an update's
   weight in the aggregate, so an uncapped count lets one peer outweigh all others.

A witness then checks what passed against the loss (``swarm.score_rows``, node/train/score.py): an
update that makes the model worse on rows of the witness's own drawing is counted as 'harmful' and left out
of the witness's report (still held and, if most witnesses list it, applied: exchange.RoundExchange._decode).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

from gradnode.node.config import Config
from gradnode.node.swarm.identity import verify
from gradnode.node.train.engine import codec_params
from gradnode.protocol import CodecParams, ProtocolError, decode_update
from gradnode.protocol.compress import Compressor, Options
from gradnode.protocol.wire import signed_part

log = logging.getLogger(__name__)

REASONS = ("malformed", "unsigned", "forged", "replayed", "wrong_codec", "inflated_tokens", "oversized", "harmful")
JUDGEMENTS = ("harmful",)  # reasons that are one witness's judgement, not a proof: no strike, only no vote


def max_tokens_per_round(cfg: Config) -> int:
    """The most tokens one peer can train on in one round under the run's config."""
    return cfg.inner.steps * cfg.inner.batch_size * cfg.inner.grad_accum * cfg.model.seq_len


@dataclass(frozen=True)
class UpdateRules:
    run_id: str
    shapes: dict[str, tuple[int, ...]]
    codec: CodecParams | Options
    max_bytes: int
    max_tokens: int
    # the run's compressor where its codec is a family's: the engine's, which holds the shared state a family
    # decodes with (PowerSGD's basis of the round: an update of round r is checked after round r - 1 is applied)
    compressor: Compressor | None = None

    @classmethod
    def of(cls, cfg: Config, shapes: dict[str, tuple[int, ...]],
           compressor: Compressor | None = None) -> "UpdateRules":
        return cls(run_id=cfg.run.run_id, shapes=shapes, codec=codec_params(cfg),
                   max_bytes=cfg.swarm.max_update_bytes, max_tokens=max_tokens_per_round(cfg), compressor=compressor)

    def check(self, blob: bytes, *, sender: str, round_: int,
              key_of: Callable[[str], bytes | None]) -> tuple[Any | None, str | None]:
        """(update, None) when ``blob`` is ``sender``'s valid update of this run and round; (None, reason)
        otherwise, the reason one of REASONS. ``key_of(peer_id)``: the public key of a member (DER), or None."""
        if len(blob) > self.max_bytes:
            return None, "oversized"
        try:
            digest, signature = signed_part(blob)
        except ProtocolError as err:
            log.info("malformed update sender=%s round=%d error=%s", sender[:12], round_, err)
            return None, "malformed"
        if not signature:
            return None, "unsigned"
        key = key_of(sender)
        if key is None or not verify(key, digest, signature):
            return None, "forged"
        try:
            upd = decode_update(blob, max_bytes=self.max_bytes, expected=self.shapes, compressor=self.compressor)
        except ProtocolError as err:
            log.info("malformed update sender=%s round=%d error=%s", sender[:12], round_, err)
            return None, "malformed"
        if upd.sender != sender:
            return None, "forged"
        if upd.run_id != self.run_id or upd.round != round_:
            return None, "replayed"
        if upd.params != self.codec:
            return None, "wrong_codec"
        if upd.tokens > self.max_tokens:
            return None, "inflated_tokens"
        return upd, None

    @staticmethod
    def weight(update: Any) -> float:
        """An accepted update's weight in the aggregate: the tokens it stands for (capped by ``check``)."""
        return float(max(int(update.tokens), 1))

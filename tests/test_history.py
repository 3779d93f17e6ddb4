"""Who witnesses a round: the contributors of the last WITNESS_WINDOW rounds, by the shared ledger."""

from __future__ import annotations

from gradnode.protocol.witness import WITNESS_WINDOW, eligible_witnesses


def test_a_witness_left_out_of_rounds_still_witnesses_until_the_window_passes() -> None:
    """Round 3's set held only the censor's update (before witnesses, a censoring leader could do that).
    Under the rule before the window (the newest round's senders) the censor was then the next round's only
    eligible peer, and of every round after. Everyone whose update was applied in the last WITNESS_WINDOW
    rounds witnesses: a, b and c stay until WITNESS_WINDOW rounds in a row left them out."""
    ledger: dict[str, int] = {}
    for r in range(3):
        ledger.update({p: r for p in ("a", "b", "c", "censor")})
    ledger["censor"] = 3
    assert eligible_witnesses(ledger, 4) == ["a", "b", "c", "censor"]
    for r in range(4, 2 + WITNESS_WINDOW):
        ledger["censor"] = r
        assert eligible_witnesses(ledger, r + 1) == ["a", "b", "c", "censor"], r
    assert eligible_witnesses(ledger, 3 + WITNESS_WINDOW) == ["censor"]
    assert eligible_witnesses({}, 0) == []  # nobody contributed yet: the live trainers witness (agreement.py)
    assert eligible_witnesses({"a": 9}, 9) == []  # a round never counts its own contributors

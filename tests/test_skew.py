"""protocol/skew.py: how far this clock is from the peers', from pings."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from gradnode.protocol.skew import MAX_SKEW_S, Sample, estimate


def ping(ahead: float, sent: float, out: float, back: float, theirs_ahead: float | None = None) -> Sample:
    """A ping from a clock ``ahead`` s ahead of true time, ``out`` s on the way there, ``back`` s back; the other
    side's clock ``theirs_ahead`` s ahead of true time (0: right)."""
    true_sent = sent - ahead
    theirs = true_sent + out + (theirs_ahead or 0.0)
    return Sample(sent, theirs, sent + out + back)


delays = st.floats(0.0, 5.0)


@given(ahead=st.floats(-1e4, 1e4), out=st.lists(delays, min_size=1, max_size=9),
       back=st.lists(delays, min_size=9, max_size=9))
def test_the_estimate_is_within_its_error_of_the_truth_whatever_the_delays(ahead: float, out: list[float],
                                                                           back: list[float]) -> None:
    found = estimate([ping(ahead, 1.8e9 + i, o, b) for i, (o, b) in enumerate(zip(out, back))])
    assert found.peers == len(out)
    assert abs(found.ahead_s - ahead) <= found.error_s + 1e-6


lies = st.tuples(st.floats(-1e6, 1e6), st.floats(0.0, 5.0))  # the time a liar claims, and how fast it answers


@given(ahead=st.floats(-100, 100), honest=st.lists(st.tuples(delays, delays), min_size=1, max_size=6),
       liars=st.data())
def test_wrong_or_lying_clocks_up_to_half_cannot_raise_the_alarm_or_move_the_estimate_off_the_truth(
        ahead: float, honest: list[tuple[float, float]], liars) -> None:
    told = liars.draw(st.lists(lies, max_size=len(honest)))
    samples = [ping(ahead, 1.8e9, out, back) for out, back in honest]
    samples += [ping(ahead, 1.8e9, rtt / 2, rtt / 2, theirs_ahead=lie) for lie, rtt in told]
    found = estimate(liars.draw(st.permutations(samples)))
    assert abs(found.ahead_s - ahead) <= found.error_s + 1e-6  # the truth is inside
    if abs(ahead) <= MAX_SKEW_S:
        assert not found.off()
    if len(told) < len(honest):  # fewer than half: no wider than the right clocks' own intervals
        right = [s.offset for s in samples[:len(honest)]]
        width = [s.error for s in samples[:len(honest)]]
        assert min(o - e for o, e in zip(right, width)) - 1e-6 <= -found.ahead_s - found.error_s
        assert -found.ahead_s + found.error_s <= max(o + e for o, e in zip(right, width)) + 1e-6


def test_more_than_half_wrong_clocks_can_raise_the_alarm_which_is_why_whom_to_ping_matters() -> None:
    right, wrong = ping(0.0, 1.8e9, 0.1, 0.1), ping(0.0, 1.8e9, 0.01, 0.01, theirs_ahead=-50.0)
    assert not estimate([right, wrong]).off() and estimate([right, wrong, wrong]).off()


def test_off_only_past_the_bound_and_what_the_round_trip_hides() -> None:
    assert not estimate([]).off() and estimate([]).peers == 0
    assert estimate([ping(40.0, 1.8e9, 0.1, 0.1)]).off()
    assert estimate([ping(-40.0, 1.8e9, 0.1, 0.1)]).off()
    assert not estimate([ping(MAX_SKEW_S - 0.5, 1.8e9, 0.1, 0.1)]).off()
    # 4 s apart by the midpoint, but a 3 s round trip could hide 1.5 of them: not proven off
    assert not estimate([ping(4.0, 1.8e9, 1.5, 1.5)]).off()


def test_a_clock_stepped_between_send_and_answer_or_a_time_that_is_no_number_gives_no_sample() -> None:
    assert estimate([Sample(sent=100.0, theirs=50.0, received=90.0)]).peers == 0
    right = Sample(sent=100.0, theirs=100.1, received=100.2)
    for bad in (math.nan, math.inf, -math.inf):
        found = estimate([right, Sample(sent=100.0, theirs=bad, received=100.2), right])
        assert found.peers == 2 and abs(found.ahead_s) < 1e-9 and not found.off(), found

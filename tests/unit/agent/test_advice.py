"""The loud warning a --persist worker prints: its clock advice is only as good as the answer it came in.

regression (issue 37 finding 8): "this box's clock is N s behind" was said as fact from the unsigned GET /join/id,
whatever answered there."""

from __future__ import annotations

from fdl.agent.failures import likely_causes


def test_clock_advice_from_a_proved_answer_is_said_as_fact() -> None:
    text = likely_causes("10.0.0.1:1337", 3, 90.0, proven=True)
    assert "this box's clock is 90 s behind what 10.0.0.1:1337 says its clock is (in an answer that proved" in text
    assert "unverified" not in text


def test_clock_advice_from_an_unproved_answer_is_labelled_unverified() -> None:
    text = likely_causes("10.0.0.1:1337", 3, -120.0, proven=False)
    assert "(unverified: its answer proved no token) that this box is 120 s ahead of its clock" in text
    assert "this box's clock is 120 s" not in text


def test_an_absurd_or_missing_clock_says_nothing_of_it() -> None:
    for skew in (None, 10.0, 10 * 365 * 86400.0):
        text = likely_causes("h:1", 3, skew, proven=True)
        assert "this box's clock is more than 60 s off the controller's" in text

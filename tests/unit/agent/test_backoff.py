"""Re-dial backoff: grows exponentially, is capped, jitters within bounds, resets on a clean finish."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fdl.agent.backoff import Backoff


def test_grows_then_caps():
    b = Backoff(1.0, 8.0, rng=random.Random(1))
    ceilings = []
    for _ in range(7):
        wait = b.after_failure()
        ceilings.append(b.ceiling())
        assert b.ceiling() / 2 <= wait <= b.ceiling()
    assert ceilings == [1, 2, 4, 8, 8, 8, 8]


def test_a_clean_finish_resets_the_count():
    b = Backoff(2.0, 60.0, rng=random.Random(2))
    for _ in range(5):
        b.after_failure()
    assert b.ceiling() == 32
    wait = b.after_success()
    assert 1.0 <= wait <= 2.0 and b.failures == 0
    assert b.after_failure() <= 2.0


@given(st.integers(min_value=0, max_value=2**32 - 1), st.integers(min_value=1, max_value=60))
def test_waits_stay_within_bounds(seed, failures):
    b = Backoff(0.5, 30.0, rng=random.Random(seed))
    for _ in range(failures):
        wait = b.after_failure()
        assert 0.25 <= wait <= 30.0


def test_jitter_spreads_a_fleet():
    waits = {round(Backoff(2.0, 60.0, rng=random.Random(seed)).after_failure(), 3) for seed in range(50)}
    assert len(waits) > 40  # boxes that failed together do not re-dial together


def test_from_env_reads_bounds_and_ignores_nonsense():
    b = Backoff.from_env({"FDL_JOIN_BACKOFF_BASE_S": "0.1", "FDL_JOIN_BACKOFF_MAX_S": "0.4"})
    assert (b.base_s, b.max_s) == (0.1, 0.4)
    d = Backoff.from_env({"FDL_JOIN_BACKOFF_BASE_S": "-1", "FDL_JOIN_BACKOFF_MAX_S": "x"})
    assert (d.base_s, d.max_s) == (2.0, 60.0)
    with pytest.raises(ValueError):
        Backoff(5.0, 1.0)

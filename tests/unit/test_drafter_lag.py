"""The drafter-cache lag bookkeeping behind skipping an idle draft_model forward."""

import pytest

from dspark_dynamic.core.drafter_lag import DrafterLag, Row


def test_a_skipped_step_opens_a_hole_the_next_forward_fills():
    lag = DrafterLag(max_lag=8)
    step = [Row("a", 10, 1), Row("b", 40, 3)]
    assert lag.may_skip(step)
    lag.skip(step)
    assert (lag.behind("a"), lag.behind("b")) == (10, 40)
    # a second skipped step keeps the first hole's start
    lag.skip([Row("a", 11, 1), Row("b", 42, 1)])
    assert (lag.behind("a"), lag.behind("b")) == (10, 40)
    # the next forward: a's query starts at 12, b's at 43
    assert lag.catch_up([Row("b", 43, 1), Row("a", 12, 2)]) == [3, 2]
    assert len(lag) == 0 and lag.caught_up_positions == 5 and lag.skipped_steps == 2
    assert lag.catch_up([Row("a", 14, 1)]) == [0]  # filled once


def test_no_step_is_skipped_that_could_leave_a_request_more_than_max_lag_behind():
    lag = DrafterLag(max_lag=4)
    assert lag.may_skip([Row("a", 0, 4)])
    assert not lag.may_skip([Row("a", 0, 5)])  # a prefill chunk longer than the bound
    lag.skip([Row("a", 100, 1)])
    # every draft accepted would put a's next query at 100 + length
    assert lag.may_skip([Row("a", 101, 3)])
    assert not lag.may_skip([Row("a", 101, 4)])
    # one request too far behind stops the whole batch from skipping
    assert not lag.may_skip([Row("b", 7, 1), Row("a", 103, 2)])


def test_a_query_that_starts_at_or_before_the_hole_needs_no_catch_up():
    lag = DrafterLag()
    lag.skip([Row("a", 50, 1)])
    assert lag.catch_up([Row("a", 0, 51)]) == [0]  # recomputed from scratch after preemption
    assert lag.behind("a") is None


def test_prune_forgets_requests_that_left():
    lag = DrafterLag()
    lag.skip([Row("a", 5, 1), Row("b", 6, 1)])
    lag.prune({"b": object()})
    assert lag.behind("a") is None and lag.behind("b") == 6


def test_max_lag_must_be_positive():
    with pytest.raises(ValueError, match="max_lag"):
        DrafterLag(max_lag=0)


def test_skip_if_allowed_is_may_skip_then_skip():
    import random

    from dspark_dynamic.core.drafter_lag import DrafterLag, Row

    rng = random.Random(3)
    one, two = DrafterLag(max_lag=16), DrafterLag(max_lag=16)
    positions = {f"r{i}": 0 for i in range(4)}
    for _ in range(500):
        rows = []
        for req in rng.sample(sorted(positions), rng.randint(1, 4)):
            length = rng.randint(1, 3)
            rows.append(Row(req, positions[req], length))
            positions[req] += length
        allowed = one.may_skip(rows)
        if allowed:
            one.skip(rows)
        assert two.skip_if_allowed(rows) == allowed
        if not allowed or rng.random() < 0.3:  # a step that runs the drafter catches everyone up
            assert one.catch_up(rows) == two.catch_up(rows)
        assert one._behind == two._behind and one.skipped_steps == two.skipped_steps


def test_no_step_is_skipped_whose_catch_up_would_not_fit_the_budget():
    lag = DrafterLag(max_lag=100)
    lag.skip([Row("a", 10, 1), Row("b", 20, 1)])
    step = [Row("a", 30, 1), Row("b", 40, 1)]  # then 21 + 21 positions behind
    assert lag.may_skip(step, budget=42) and not lag.may_skip(step, budget=41)
    assert not lag.skip_if_allowed(step, budget=41) and lag.skipped_steps == 1
    assert lag.skip_if_allowed(step, budget=42) and lag.skipped_steps == 2
    assert lag.catch_up([Row("a", 31, 1), Row("b", 41, 1)]) == [21, 21]

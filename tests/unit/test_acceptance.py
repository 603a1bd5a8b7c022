"""Acceptance estimates: phase rates, persistence, a request's record, gated drafts (pure logic)."""

import random
import statistics

import pytest

from dspark_dynamic.core import acceptance
from dspark_dynamic.core.acceptance import (
    GateSample,
    Persistence,
    PositionRates,
    RequestRecord,
    gated,
    logit,
    sigmoid,
    survival,
)


def observe(rates, p, steps, rng, verified=3):
    """Request-steps verifying ``verified`` drafts, each accepted with ``p`` given the ones before."""
    for _ in range(steps):
        m = 0
        while m < verified and rng.random() < p[m]:
            m += 1
        rates.tick()
        rates.learn_one(verified, m)


@pytest.mark.parametrize("p", [(0.9, 0.8, 0.7), (0.3, 0.5, 0.9)])
def test_rates_converge_to_each_positions_conditional_acceptance(p):
    rates = PositionRates(3, prior_weight=2.0, window=5000)
    observe(rates, p, 6000, random.Random(0))
    assert rates.predict_one() == pytest.approx(list(p), abs=0.03)


def test_an_unobserved_position_borrows_its_predecessors_rate():
    rates = PositionRates(3, prior_weight=5.0)
    observe(rates, (0.8, 0.8, 0.8), 300, random.Random(1), verified=1)
    a1, a2, a3 = rates.predict_one()
    assert a2 == pytest.approx(a1) and a3 == pytest.approx(a1)


def test_evidence_fades_with_the_phases_request_steps_so_draws_spread_again():
    rates = PositionRates(1, prior_weight=4.0, window=100)
    observe(rates, (0.5,), 400, random.Random(2), verified=1)
    rng = random.Random(3)
    fresh = statistics.stdev(rates.sample(rng)[0] for _ in range(500))
    for _ in range(500):  # the phase keeps running at depth 0: no outcome, only time
        rates.tick()
    stale = statistics.stdev(rates.sample(rng)[0] for _ in range(500))
    assert stale > 2.0 * fresh
    assert rates.predict_one()[0] == pytest.approx(0.5, abs=0.08)  # the mean stays where it was


def test_a_phase_whose_first_outcomes_failed_is_tried_again_once_they_fade():
    """Fresh failures hold the rate down; faded ones leave it at 1/2 and uncertain, so a draw
    says drafting pays now and then (a stale estimate is not a dead spot)."""
    rates = PositionRates(1, prior_weight=20.0, window=400)
    for _ in range(30):
        rates.tick()
        rates.learn_one(1, 0)
    assert rates.predict_one()[0] < 0.1
    for _ in range(3000):  # the phase at depth 0: nothing verified, only time
        rates.tick()
    assert rates.predict_one()[0] == pytest.approx(0.5, abs=0.02)
    rng = random.Random(9)
    assert sum(rates.sample(rng)[0] > 0.6 for _ in range(1000)) > 100


def test_persistence_separates_independent_from_streaky_outcomes():
    rng = random.Random(4)
    independent, streaky = Persistence(), Persistence()
    prev_i = prev_s = 1.0
    state = True
    for i in range(3000):
        cur_i = 1.0 if rng.random() < 0.5 else 0.0
        if i % 50 == 0:
            state = not state
        cur_s = 1.0 if rng.random() < (0.95 if state else 0.05) else 0.0
        independent.learn_one(prev_i, cur_i)
        streaky.learn_one(prev_s, cur_s)
        prev_i, prev_s = cur_i, cur_s
    assert independent.predict_one() < 0.1
    assert streaky.predict_one() > 0.6


def test_a_fresh_request_of_a_streaky_phase_is_uncertain_and_one_of_an_independent_phase_is_not():
    rng = random.Random(5)
    rates = [0.5]

    def spread(rho, record):
        draws = [sigmoid(logit(0.5) + record.sample_offsets(rates, rho, rng)[0]) for _ in range(400)]
        return statistics.stdev(draws)

    fresh = RequestRecord("reasoning", 1)
    assert spread(0.9, fresh) > 0.3  # nearly 0 or 1: a few verified drafts will tell which
    assert spread(0.002, fresh) < 0.04  # a request is its phase
    failing = RequestRecord("reasoning", 1)
    for _ in range(6):
        failing.learn_one(1, 0)
    assert failing.mean_offsets(rates, 0.9)[0] < -2.0  # its own record says its drafts fail
    assert failing.mean_offsets(rates, 0.002)[0] > -0.05  # ... which counts for nothing without persistence
    for _ in range(60):  # a record ages: after a few memories the request is its phase again
        failing.age()
    assert abs(failing.mean_offsets(rates, 0.9)[0]) < 0.5


def test_gated_drafts_are_priced_under_a_requests_shifts():
    sample = GateSample(2)
    sample.learn_one([2.0, 1.0])
    sample.learn_one([-2.0])  # a draft that stopped after one position
    plain = sample.survivals([0.0, 0.0], 2)
    assert plain[0] == pytest.approx([sigmoid(2.0), sigmoid(-2.0)])
    assert plain[1] == pytest.approx([sigmoid(2.0) * sigmoid(1.0)])
    up = sample.survivals([1.0, 1.0], 2)
    assert up[1] == pytest.approx([sigmoid(3.0) * sigmoid(2.0)])
    gain, share = gated(plain[0], 0.5)
    assert gain == pytest.approx((sigmoid(2.0) - 0.5) / 2) and share == 0.5
    assert sample.gated(0, 0.5) == pytest.approx((gain, share))  # the sorted form says the same


def test_the_reservoir_keeps_the_last_drafts_in_order():
    rng = random.Random(7)
    sample = GateSample(2)
    kept = []
    for _ in range(3 * acceptance.RESERVOIR):
        z = [rng.gauss(0.0, 2.0), rng.gauss(0.0, 2.0)]
        sample.learn_one(z)
        kept = (kept + [z])[-acceptance.RESERVOIR:]
    expected = GateSample(2)
    for z in kept:
        expected.learn_one(z)
    assert sample.entries == expected.entries
    for j in range(2):  # the counts and means follow the drafts coming and going
        survivals = sample.survivals([0.0, 0.0], 2)[j]
        assert sample.count(j) == len(survivals) == acceptance.RESERVOIR
        assert sample.mean(j) == pytest.approx(sum(survivals) / len(survivals), rel=1e-12)
    for price in (0.1, 0.4, 0.8):
        assert sample.gated(1, price) == pytest.approx(gated(sample.survivals([0.0, 0.0], 2)[1], price))


def test_gated_drafts_are_repriced_with_each_draw_of_the_calibration():
    """Drafts learned under one calibration and repriced with another read as if learned under
    the second: the survivals, the running means and the gated gains."""
    rng = random.Random(8)
    features = [[rng.gauss(1.0, 2.0), rng.gauss(1.0, 2.0)] for _ in range(acceptance.RESERVOIR + 5)]
    theta = [1.7, -0.4, -1.1]
    repriced, fresh = GateSample(2), GateSample(2)
    fresh.price(theta)
    for f in features:
        repriced.learn_one(f)
        fresh.learn_one(f)
    before = repriced.survivals([0.0, 0.0], 2)
    repriced.price(theta)
    for j in range(2):
        assert repriced.survivals([0.0, 0.0], 2)[j] == pytest.approx(fresh.survivals([0.0, 0.0], 2)[j])
        assert repriced.survivals([0.0, 0.0], 2)[j] != pytest.approx(before[j])
        assert repriced.mean(j) == pytest.approx(fresh.mean(j), rel=1e-12)
        assert repriced.gated(j, 0.3) == pytest.approx(fresh.gated(j, 0.3))
    w, b1, _b2 = theta
    assert fresh.survivals([0.0, 0.0], 2)[0][-1] == pytest.approx(sigmoid(w * features[-1][0] + b1))


def test_survival_is_the_running_product():
    assert survival([0.5, 0.5, 1.0]) == [0.5, 0.25, 0.25]

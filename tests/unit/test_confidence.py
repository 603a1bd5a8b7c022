"""Draft confidences: the online calibration and the admission rule (pure logic)."""

import itertools
import math
import random

import pytest

from dspark_dynamic.core.confidence import ConfidenceCalibrator, admit, feature_of


def logistic_data(n, slope, intercepts, rng, spread=2.0):
    """(features, verified, accepted) request-steps from sigmoid(slope*f + b_j) per position."""
    for _ in range(n):
        f = [rng.gauss(0.5, spread) for _ in intercepts]
        m = 0
        while m < len(f) and rng.random() < 1 / (1 + math.exp(-(slope * f[m] + intercepts[m]))):
            m += 1
        yield f, len(f), m


def test_fit_recovers_slope_and_per_position_intercepts():
    cal = ConfidenceCalibrator(2)
    for f, k, m in logistic_data(20000, 1.2, [-0.5, 1.0], random.Random(0)):
        cal.observe(f, k, m)
    w, b1, b2 = cal.theta
    assert w == pytest.approx(1.2, abs=0.25)
    assert b1 == pytest.approx(-0.5, abs=0.35) and b2 == pytest.approx(1.0, abs=0.45)
    report = cal.report
    assert report.predicted_rate == pytest.approx(report.observed_rate, abs=0.02)
    assert report.ece() < 0.05
    assert 0.75 < report.auc() < 0.95


def test_labels_stop_after_the_first_rejected_draft():
    cal = ConfidenceCalibrator(3)
    cal.observe([1.0, 1.0, 1.0], verified=3, accepted=1)  # accepted, rejected, unobserved
    assert (cal.report.labels, cal.report.observed) == (2, 1)
    cal.observe([1.0, 1.0, 1.0], verified=2, accepted=2)  # both accepted; the third never verified
    assert (cal.report.labels, cal.report.observed) == (4, 3)
    cal.observe([1.0], verified=0, accepted=0)
    assert cal.report.labels == 4


def test_an_uninformative_feature_gets_no_slope():
    cal = ConfidenceCalibrator(1)
    rng = random.Random(1)
    for _ in range(5000):
        cal.observe([rng.gauss(0, 3)], 1, int(rng.random() < 0.6))
    assert cal.theta[0] < 0.1
    assert cal.prob(5.0, 0) == pytest.approx(0.6, abs=0.07)
    assert cal.report.auc() == pytest.approx(0.5, abs=0.05)


def test_follows_an_abrupt_drift_within_tens_of_labels():
    """Every draft accepted, then none, with the same (confident) feature: the estimate must fall
    below one half within 30 labels."""
    cal = ConfidenceCalibrator(1)
    for _ in range(3000):
        cal.observe([3.0], 1, 1)
    assert cal.prob(3.0, 0) > 0.95
    for i in range(30):
        cal.observe([3.0], 1, 0)
    assert cal.prob(3.0, 0) < 0.5


def test_covariance_stays_positive_definite_on_collinear_gated_data():
    """Gated data: only confident drafts are ever verified, the feature barely moves.  The fit must
    stay finite with a symmetric positive-definite covariance (a naive update blew up here)."""
    cal = ConfidenceCalibrator(2)
    rng = random.Random(2)
    for _ in range(30000):
        f = [rng.gauss(6.0, 0.05), rng.gauss(6.0, 0.05)]
        cal.observe(f, 2, 2 if rng.random() < 0.9 else rng.randrange(2))
    assert all(math.isfinite(t) and abs(t) < 50 for t in cal.theta)
    cov = cal.cov
    for i, j in itertools.product(range(3), repeat=2):
        assert cov[i][j] == pytest.approx(cov[j][i])
    assert all(cov[i][i] > 0 for i in range(3))
    # 2x2 leading minor > 0 (slope and first intercept jointly)
    assert cov[0][0] * cov[1][1] - cov[0][1] ** 2 > 0


def test_survival_is_the_running_product_with_offsets():
    cal = ConfidenceCalibrator(2)
    cal.theta = [1.0, 0.0, 0.0]
    s = cal.survival([0.0, math.log(3.0)])
    assert s == pytest.approx([0.5, 0.5 * 0.75])
    s = cal.survival([0.0, 0.0], offsets=[math.log(3.0), 0.0])
    assert s == pytest.approx([0.75, 0.375])


def test_feature_is_the_log_odds_of_the_max_probability():
    assert feature_of(0.5) == pytest.approx(0.0)
    assert feature_of(0.9) == pytest.approx(math.log(9.0))
    assert feature_of(1.0) == 40.0 and feature_of(0.0) == -40.0


def brute_force(survivals, v, fixed=0.0):
    best, best_ratio = None, -1.0
    for ks in itertools.product(*(range(len(s) + 1) for s in survivals)):
        tokens = len(survivals) + sum(sum(s[:k]) for s, k in zip(survivals, ks))
        ratio = tokens / (len(survivals) + v * sum(ks) + (fixed if sum(ks) else 0.0))
        if ratio > best_ratio + 1e-12:
            best, best_ratio = list(ks), ratio
    return best, best_ratio


@pytest.mark.parametrize("seed", range(30))
def test_admission_maximises_tokens_per_cost(seed):
    rng = random.Random(seed)
    survivals = []
    for _ in range(rng.randint(1, 4)):
        s, row = 1.0, []
        for _ in range(rng.randint(0, 3)):
            s *= rng.random()
            row.append(s)
        survivals.append(row)
    v = rng.uniform(0.05, 1.5)
    got = admit(survivals, v)
    _, best_ratio = brute_force(survivals, v)
    tokens = len(survivals) + sum(sum(s[:k]) for s, k in zip(survivals, got))
    assert tokens / (len(survivals) + v * sum(got)) == pytest.approx(best_ratio)
    assert all(0 <= k <= len(s) for k, s in zip(got, survivals))


@pytest.mark.parametrize("seed", range(40))
def test_admission_with_a_step_term_maximises_tokens_per_cost(seed):
    """A step that verifies any draft pays ``fixed`` once (draft_model on the testbed): the
    admitted set is still the best one, whether it is empty, one request's or shared."""
    rng = random.Random(100 + seed)
    survivals = []
    for _ in range(rng.randint(1, 4)):
        s, row = 1.0, []
        for _ in range(rng.randint(0, 3)):
            s *= rng.random() ** 0.5
            row.append(s)
        survivals.append(row)
    v, fixed = rng.uniform(0.05, 0.8), rng.uniform(0.0, 1.0)
    got = admit(survivals, v, fixed=fixed)
    _, best_ratio = brute_force(survivals, v, fixed)
    tokens = len(survivals) + sum(sum(s[:k]) for s, k in zip(survivals, got))
    cost = len(survivals) + v * sum(got) + (fixed if sum(got) else 0.0)
    assert tokens / cost == pytest.approx(best_ratio)


def test_a_step_term_stops_a_lone_middling_draft_but_is_shared_across_a_batch():
    assert admit([[0.5]], 0.38) == [1]
    assert admit([[0.5]], 0.38, fixed=0.17) == [0]  # 1.5 tokens for 1.55: not worth it
    assert admit([[0.5], [0.5]], 0.38, fixed=0.17) == [1, 1]  # 3 tokens for 2.93
    assert admit([[0.5], [0.5]], 0.38, uniform="max", fixed=0.17) == [1, 1]
    assert admit([[0.5]], 0.38, uniform="max", fixed=0.17) == [0]
    assert admit([[0.9, 0.81]], 0.38, fixed=0.17) == [2]


def test_admission_single_request_threshold():
    # one request: admit draft j while its survival beats v * (tokens so far / cost so far)
    assert admit([[0.9, 0.81]], 0.5) == [2]
    assert admit([[0.4, 0.16]], 0.5) == [0]
    assert admit([[0.6, 0.2]], 0.5) == [1]
    assert admit([], 0.5) == []


def test_uniform_admission_gives_every_request_one_depth():
    survivals = [[0.95, 0.9], [0.3, 0.1], [0.9, 0.2]]
    ks = admit(survivals, 0.5, uniform="max")
    assert len(set(ks)) == 1
    best_k = max(range(3), key=lambda k: (3 + sum(sum(s[:k]) for s in survivals)) / (3 + 0.5 * 3 * k))
    assert ks == [best_k] * 3
    assert admit([[0.9], []], 0.5, uniform="max") == [1, 0]  # capped by the drafts a request has


@pytest.mark.parametrize("uniform", ["max", "min"])
def test_uniform_admission_of_one_request_is_the_best_depth(uniform):
    """One request: the fast path must pick the k with the best T/C, ties toward the deeper k
    under "max" (below, k = 0 and k = 1 tie exactly: 1 / 1 == 1.5 / 1.5)."""
    rng = random.Random(4)
    for _ in range(300):
        s, row = 1.0, []
        for _ in range(rng.randint(0, 4)):
            s *= rng.random()
            row.append(s)
        v = rng.uniform(0.05, 1.5)
        (k,) = admit([row], v, uniform=uniform)
        ratio = lambda k: (1 + sum(row[:k])) / (1 + v * k)  # noqa: E731
        assert ratio(k) == pytest.approx(max(ratio(i) for i in range(len(row) + 1)))
    assert admit([[0.5, 0.25]], 0.5, uniform="max") == [1]
    assert admit([[0.5, 0.25]], 0.5, uniform="min") == [0]


def test_two_position_update_is_the_general_update_written_out():
    """``_update2`` (the 3x3 case, unrolled for speed) must learn exactly what ``_update`` does."""
    fast, general = ConfidenceCalibrator(2), ConfidenceCalibrator(2)
    rng = random.Random(11)
    for _ in range(3000):
        f = [rng.gauss(1.0, 2.0), rng.gauss(1.0, 2.0)]
        offsets = [rng.gauss(0.0, 0.3), rng.gauss(0.0, 0.3)]
        k = rng.randint(0, 2)
        m = rng.randint(0, k)
        fast.observe(f, k, m, offsets)  # two positions: the unrolled path
        for j in range(min(k, m + 1)):
            general._update(f[j], j, j < m, offsets[j])
    assert fast.theta == pytest.approx(general.theta, rel=1e-9, abs=1e-12)
    for row_fast, row_general in zip(fast.cov, general.cov):
        assert row_fast == pytest.approx(row_general, rel=1e-9, abs=1e-15)
    a, b = fast.report, general.report
    assert (a.labels, a.observed, a.pos, a.neg) == (b.labels, b.observed, b.pos, b.neg)
    assert a.psum == pytest.approx(b.psum)
    assert fast.cov[0][1] == fast.cov[1][0] and fast.cov[1][2] == fast.cov[2][1]

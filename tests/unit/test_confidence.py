"""Draft confidences: the online calibration (pure logic)."""

import itertools
import math
import random

import pytest

from dspark_dynamic.core.confidence import ConfidenceCalibrator, feature_of


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


def test_two_position_draw_is_the_general_draw_written_out():
    """``_sample2`` (the 3x3 case, unrolled for speed) must draw exactly what the general
    Cholesky draw does from the same random stream, whatever the posterior."""
    rng = random.Random(12)
    cal = ConfidenceCalibrator(2)
    for f, k, m in logistic_data(400, 1.2, [0.3, -0.5], rng):
        cal.observe(f, k, m)
        seed = rng.random()
        assert cal._sample2(random.Random(seed)) == cal._sample_any(random.Random(seed))
    flat = ConfidenceCalibrator(2, slope=0.0)
    assert flat._sample2(random.Random(1)) == flat._sample_any(random.Random(1))


def test_a_draw_follows_the_posterior_and_keeps_the_slope_non_negative():
    """Draws (Thompson sampling) have the posterior's mean and covariance; a calibrator whose
    slope sits at 0 (no signal) never draws a negative one."""
    rng = random.Random(11)
    cal = ConfidenceCalibrator(2)
    for f, k, m in logistic_data(300, 1.2, [0.3, -0.5], rng):
        cal.observe(f, k, m)
    draws = [cal.sample(rng) for _ in range(20000)]
    for i in range(3):
        mean = sum(d[i] for d in draws) / len(draws)
        assert mean == pytest.approx(cal.theta[i], abs=4 * math.sqrt(cal.cov[i][i] / len(draws)))
        for j in range(3):
            cov = sum((d[i] - cal.theta[i]) * (d[j] - cal.theta[j]) for d in draws) / len(draws)
            assert cov == pytest.approx(cal.cov[i][j], abs=0.1 * math.sqrt(cal.cov[i][i] * cal.cov[j][j]))
    flat = ConfidenceCalibrator(2, slope=0.0)
    assert min(flat.sample(rng)[0] for _ in range(200)) == 0.0
    assert all(d[0] >= 0.0 for d in (flat.sample(rng) for _ in range(200)))

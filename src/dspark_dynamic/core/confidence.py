"""Draft confidences: online calibration and the batch admission rule (pure logic).

A drafter with a distribution gives one *feature* per drafted position: the log-odds of the
draft distribution's maximum probability at the request's temperature, ``f = log(q*/(1-q*))``,
clamped to ``[-FEATURE_CLAMP, FEATURE_CLAMP]``.  It scores the distribution, never the drawn
token, so trimming by it keeps verification lossless.

Calibration, per phase: ``P(draft j accepted | drafts 1..j-1 accepted, f) = sigmoid(w*f + b_j)``,
one slope ``w >= 0`` shared by the positions and one intercept ``b_j`` per position.  Labels: a
request-step that verified ``k`` drafts and accepted ``m`` observes positions ``1..min(k, m+1)``:
successes at ``1..m`` and a failure at ``m+1`` (when ``m < k``); later positions are unobserved.
The fit is an assumed-density (Gaussian posterior) update per label, using the probit
approximation of the logistic likelihood, with forgetting: before each label the covariance is mixed toward the prior's,
``P <- (1 - q) P + q P0`` with ``q = 1/memory^2``, which keeps a well-observed coefficient's
variance near ``1/(memory * information per label)``: about ``memory`` labels of memory, a
drifting drafter followed within a few tens of labels, the covariance positive definite, and a
direction never observed at the prior.  The decisions read a draw from the posterior
(``sample``, Thompson sampling): a calibrator with few labels is uncertain, so some draws verify
and it gets labels, where its mean alone might verify nothing and never learn.

Reports (cumulative, on predictions made *before* each label was learned): mean predicted vs
observed acceptance, ROC-AUC and expected calibration error, from ``BINS`` probability bins.

A request's survival ``s_j = prod_{i<=j} p_i`` is the expected number of tokens its j-th
draft adds; ``decide.admit`` turns the step's survivals into depths.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from dspark_dynamic.core.draws import normals

FEATURE_CLAMP = 40.0
BINS = 20
CALIBRATOR_MEMORY = 100.0  # labels of memory (tuned: a drifting drafter followed within tens of labels)
_PI_8 = math.pi / 8.0


def feature_of(max_prob: float) -> float:
    """Log-odds of a maximum probability, clamped (the same feature the adapter computes)."""
    if max_prob >= 1.0:
        return FEATURE_CLAMP
    if max_prob <= 0.0:
        return -FEATURE_CLAMP
    return max(-FEATURE_CLAMP, min(FEATURE_CLAMP, math.log(max_prob / (1.0 - max_prob))))


LOG_PROB_RESOLUTION = 2.0 ** -24  # float32 resolves 1 - q* down to about here (log q* near 0)


def feature_of_log_prob(log_q: float) -> float:
    """The feature from ``log q*`` as a float32 log-softmax gives it: ``log q* - log(1 - q*)``,
    with ``1 - q* = -expm1(log q*)`` floored at float32's resolution, so a row too peaked for
    float32 to tell from certainty gets about 16.6 (not an infinity), and the feature is monotone
    in ``log q*``."""
    one_minus = -math.expm1(log_q) if log_q < 0.0 else 0.0
    f = log_q - math.log(one_minus if one_minus > LOG_PROB_RESOLUTION else LOG_PROB_RESOLUTION)
    return -FEATURE_CLAMP if f < -FEATURE_CLAMP else (FEATURE_CLAMP if f > FEATURE_CLAMP else f)


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _assumed_density_step(z: float, var: float, accepted: bool) -> tuple[float, float]:
    """One label's assumed-density update of the Gaussian posterior: with ``px = P x``, the
    mean moves by ``px * step`` and the covariance by ``-g * px px^T``.  ``z = x.theta`` (plus
    offset), ``var = x^T P x``.  The logistic likelihood's probit approximation shrinks the
    predictive probability toward 1/2 by the uncertainty of ``x.theta``, so steps stay bounded."""
    if var < 0.0:
        var = 0.0
    kappa = 1.0 / math.sqrt(1.0 + _PI_8 * var)
    p_pred = _sigmoid(kappa * z)
    curv = kappa * kappa * p_pred * (1.0 - p_pred)
    denom = 1.0 + curv * var
    return kappa * ((1.0 if accepted else 0.0) - p_pred) / denom, curv / denom


@dataclass
class CalibrationReport:
    """Cumulative out-of-sample quality of the calibrated probabilities."""

    labels: int = 0
    predicted: float = 0.0  # sum of predicted probabilities
    observed: int = 0  # accepted labels
    pos: list[int] = field(default_factory=lambda: [0] * BINS)  # accepted labels per bin
    neg: list[int] = field(default_factory=lambda: [0] * BINS)
    psum: list[float] = field(default_factory=lambda: [0.0] * BINS)  # predicted sum per bin

    def add(self, p: float, accepted: bool) -> None:
        b = min(BINS - 1, int(p * BINS))
        self.labels += 1
        self.predicted += p
        self.psum[b] += p
        if accepted:
            self.observed += 1
            self.pos[b] += 1
        else:
            self.neg[b] += 1

    @property
    def predicted_rate(self) -> float:
        return self.predicted / self.labels if self.labels else 0.0

    @property
    def observed_rate(self) -> float:
        return self.observed / self.labels if self.labels else 0.0

    def auc(self) -> float | None:
        """ROC-AUC over the binned predictions (ties within a bin count one half)."""
        n_pos, n_neg = sum(self.pos), sum(self.neg)
        if not n_pos or not n_neg:
            return None
        below = 0  # negatives in lower bins
        total = 0.0
        for b in range(BINS):
            total += self.pos[b] * (below + 0.5 * self.neg[b])
            below += self.neg[b]
        return total / (n_pos * n_neg)

    def ece(self) -> float | None:
        """Expected calibration error: sum over bins of |mean predicted - observed| * share."""
        if not self.labels:
            return None
        err = 0.0
        for b in range(BINS):
            n = self.pos[b] + self.neg[b]
            if n:
                err += abs(self.psum[b] - self.pos[b])
        return err / self.labels

    def reliability(self) -> list[tuple[float, float, int]]:
        """(mean predicted, observed rate, labels) per non-empty bin: the reliability diagram."""
        out = []
        for b in range(BINS):
            n = self.pos[b] + self.neg[b]
            if n:
                out.append((self.psum[b] / n, self.pos[b] / n, n))
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "labels": self.labels, "predicted": self.predicted, "observed": self.observed,
            "pos": list(self.pos), "neg": list(self.neg), "psum": list(self.psum),
        }

    def metric_fields(self) -> dict[str, float]:
        """The numbers ``/metrics`` shows per phase (AUC and ECE only once they exist)."""
        out = {"conf_labels": float(self.labels), "conf_predicted": self.predicted, "conf_accepted": float(self.observed)}
        auc, ece = self.auc(), self.ece()
        if auc is not None:
            out["conf_auc"] = auc
        if ece is not None:
            out["conf_ece"] = ece
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "CalibrationReport":
        """The inverse of ``to_dict`` (extra keys are ignored)."""
        return cls(int(data["labels"]), float(data["predicted"]), int(data["observed"]),
                   [int(x) for x in data["pos"]], [int(x) for x in data["neg"]], [float(x) for x in data["psum"]])

    def describe(self) -> str:
        auc, ece = self.auc(), self.ece()
        return (
            f"confidence: predicted/observed acceptance {self.predicted_rate:.3f}/{self.observed_rate:.3f}, "
            f"AUC {'n/a' if auc is None else f'{auc:.3f}'}, ECE {'n/a' if ece is None else f'{ece:.3f}'}, "
            f"labels {self.labels}"
        )


class ConfidenceCalibrator:
    """``sigmoid(w*f + b_j)`` for one phase, fitted online (see the module docstring).

    Invariants: ``w >= 0``; the covariance stays symmetric positive definite, at most the prior's.
    """

    def __init__(
        self,
        positions: int,
        memory: float = CALIBRATOR_MEMORY,
        slope: float = 0.5,
        intercept: float = 0.0,
        slope_var: float = 1.0,
        intercept_var: float = 4.0,
    ) -> None:
        self.positions = positions
        self.dim = positions + 1  # theta = (w, b_1..b_N)
        self.theta = [slope] + [intercept] * positions
        self.prior_var = [slope_var] + [intercept_var] * positions
        self.cov = [[self.prior_var[i] if i == j else 0.0 for j in range(self.dim)] for i in range(self.dim)]
        self.keep = 1.0 - 1.0 / (memory * memory)
        self._fresh_var = [(1.0 - self.keep) * v for v in self.prior_var]
        self.report = CalibrationReport()

    def sample(self, rng: random.Random) -> list[float]:
        """One draw of ``theta = (w, b_1..b_N)`` from the posterior (``w`` kept ``>= 0``)."""
        return self._sample2(rng) if self.dim == 3 else self._sample_any(rng)

    def _sample_any(self, rng: random.Random) -> list[float]:
        cov, dim = self.cov, self.dim
        chol: list[list[float]] = []  # lower-triangular L with L L^T = cov
        for i in range(dim):
            row = [0.0] * dim
            for j in range(i):
                acc = cov[i][j] - sum(row[k] * chol[j][k] for k in range(j))
                row[j] = acc / chol[j][j] if chol[j][j] > 0.0 else 0.0
            acc = cov[i][i] - sum(v * v for v in row[:i])
            row[i] = math.sqrt(acc) if acc > 0.0 else 0.0
            chol.append(row)
        eps = normals(rng, dim)
        theta = [t + sum(row[k] * eps[k] for k in range(i + 1)) for i, (t, row) in enumerate(zip(self.theta, chol))]
        if theta[0] < 0.0:
            theta[0] = 0.0
        return theta

    def _sample2(self, rng: random.Random) -> list[float]:
        """``sample`` written out for two positions (a 3x3 covariance), the same floats."""
        (c00, _, _), (c10, c11, _), (c20, c21, c22) = self.cov
        l00 = math.sqrt(c00) if c00 > 0.0 else 0.0
        l10 = c10 / l00 if l00 > 0.0 else 0.0
        acc = c11 - l10 * l10
        l11 = math.sqrt(acc) if acc > 0.0 else 0.0
        l20 = c20 / l00 if l00 > 0.0 else 0.0
        l21 = (c21 - l20 * l10) / l11 if l11 > 0.0 else 0.0
        acc = c22 - (l20 * l20 + l21 * l21)
        l22 = math.sqrt(acc) if acc > 0.0 else 0.0
        e0, e1, e2 = normals(rng, 3)
        t0, t1, t2 = self.theta
        theta = [t0 + l00 * e0, t1 + (l10 * e0 + l11 * e1), t2 + (l20 * e0 + l21 * e1 + l22 * e2)]
        if theta[0] < 0.0:
            theta[0] = 0.0
        return theta

    def prob(self, feature: float, position: int, offset: float = 0.0) -> float:
        """P(draft at ``position`` (0-based) accepted | the drafts before it were); ``offset``: a
        known shift in log-odds (e.g. the request's own recent record), not fitted."""
        return _sigmoid(self.theta[0] * feature + self.theta[1 + min(position, self.positions - 1)] + offset)

    def logits(self, features: Sequence[float]) -> list[float]:
        """The calibrated log-odds ``w*f + b_j`` of each draft (no offset)."""
        theta = self.theta
        w = theta[0]
        return [w * f + theta[1 + j] for j, f in enumerate(features[: self.positions])]

    def survival(self, features: Sequence[float], offsets: Sequence[float] | None = None) -> list[float]:
        """Expected-token contribution of each draft: the running product of its probabilities."""
        theta = self.theta
        w = theta[0]
        out: list[float] = []
        s = 1.0
        for j, f in enumerate(features[: self.positions]):
            z = w * f + theta[1 + j]
            if offsets:
                z += offsets[j]
            s *= 1.0 / (1.0 + math.exp(-z)) if z >= 0.0 else 1.0 - 1.0 / (1.0 + math.exp(z))
            out.append(s)
        return out

    def observe(self, features: Sequence[float], verified: int, accepted: int,
                offsets: Sequence[float] | None = None) -> None:
        """Learn from one request-step that verified ``verified`` drafts with these features
        (and the offsets its probabilities were computed with)."""
        update = self._update2 if self.positions == 2 else self._update
        for j in range(min(verified, accepted + 1, len(features), self.positions)):
            update(features[j], j, j < accepted, offsets[j] if offsets else 0.0)

    def _update(self, f: float, j: int, accepted: bool, offset: float = 0.0) -> None:
        theta, cov, b = self.theta, self.cov, 1 + j
        z = theta[0] * f + theta[b] + offset
        self.report.add(_sigmoid(z), accepted)
        # forgetting: mix the covariance toward the prior's (stays positive definite and bounded);
        # then px = P x, where x has two non-zeros: x[0] = f, x[b] = 1
        keep = self.keep
        px = []
        for i, row in enumerate(cov):
            row[:] = [v * keep for v in row]
            row[i] += self._fresh_var[i]
            px.append(row[0] * f + row[b])
        var = f * px[0] + px[b]
        step, g = _assumed_density_step(z, var, accepted)
        for i, pi in enumerate(px):
            theta[i] += pi * step
            # (pi * pk) * g is the same float for (i, k) and (k, i): the covariance stays symmetric
            cov[i] = [c - (pi * pk) * g for c, pk in zip(cov[i], px)]
        if theta[0] < 0.0:
            theta[0] = 0.0

    def _update2(self, f: float, j: int, accepted: bool, offset: float = 0.0) -> None:
        """``_update`` written out for two positions (a 3x3 covariance), the common depth."""
        theta, cov = self.theta, self.cov
        z = theta[0] * f + theta[1 + j] + offset
        self.report.add(_sigmoid(z), accepted)
        keep = self.keep
        v0, v1, v2 = self._fresh_var
        r0, r1, r2 = cov
        c00, c01, c02 = r0[0] * keep + v0, r0[1] * keep, r0[2] * keep
        c11, c12, c22 = r1[1] * keep + v1, r1[2] * keep, r2[2] * keep + v2
        if j == 0:
            p0, p1, p2 = c00 * f + c01, c01 * f + c11, c02 * f + c12
            var = f * p0 + p1
        else:
            p0, p1, p2 = c00 * f + c02, c01 * f + c12, c02 * f + c22
            var = f * p0 + p2
        step, g = _assumed_density_step(z, var, accepted)
        theta[0] += p0 * step
        theta[1] += p1 * step
        theta[2] += p2 * step
        c00 -= (p0 * p0) * g
        c01 -= (p0 * p1) * g
        c02 -= (p0 * p2) * g
        c11 -= (p1 * p1) * g
        c12 -= (p1 * p2) * g
        c22 -= (p2 * p2) * g
        cov[0], cov[1], cov[2] = [c00, c01, c02], [c01, c11, c12], [c02, c12, c22]
        if theta[0] < 0.0:
            theta[0] = 0.0

    def describe(self) -> str:
        b = ", ".join(f"{v:.2f}" for v in self.theta[1:])
        return f"slope {self.theta[0]:.2f}, intercepts [{b}]; {self.report.describe()}"


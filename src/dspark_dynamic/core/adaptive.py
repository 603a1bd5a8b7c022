"""Adaptive depth: choose k from measured acceptance and step cost (pure logic).

Model, per phase (reasoning / answer):
- ``a_j`` = P(draft j accepted | drafts 1..j-1 accepted), for j = 1..N.  A request-step that
  verified k drafts and accepted m observes positions 1..min(k, m+1): successes at 1..m and a
  failure at m+1 (when m < k).  Counts decay with factor ``1 - 1/window`` per observation.
  An unobserved or thinly observed position borrows its predecessor's rate (prior weight
  ``prior_weight``), so a depth that is rarely used starts from a sensible guess.
- Each request also keeps a short-memory estimate blended with its phase's; it ages every step
  (``REQUEST_WINDOW`` steps), so a request whose drafts are currently easy (or hard) gets its
  own depth, and one parked at k = 0 drifts back to the phase estimate and probes again.  How
  much a request's own record counts is learned per phase from the persistence (lag-1
  autocorrelation) of draft outcomes: independent outcomes make it count for almost nothing.
- Expected tokens of a step at depth k: ``E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i``.
- Cost of a step at depth k, in units of a plain decode step:
  ``C(k) = 1 + draft_cost_ratio + verify_cost_ratio * k``.  The drafter runs whatever k the
  controller picks, so k = 0 still pays ``draft_cost_ratio``.  With ``learn_cost`` the costs
  are refitted from measured engine-step times (least squares with forgetting, see
  ``StepCostModel``) once the data spans several depths, with step terms when the data shows
  them: ``f``, what a step pays once for verifying any draft, and ``g``, once for running the
  drafter at all (where the idle drafter is skipped): ``C(k) = 1 + c*k + (f + g)*[k > 0]``.
- The chosen depth maximises ``E(k) / C(k)`` over ``[min_depth, N]``, with hysteresis: a request
  moves from its current depth only for a relative gain above ``hysteresis``.  Until a phase has
  ``prior_weight`` observations the phase defaults (``reasoning_depth`` / ``answer_depth``) apply.
- Exploration: with probability ``explore`` a step uses one more draft than chosen (one fewer
  at the maximum, when costs are learned), so the estimates of deeper positions stay fresh;
  from depth 0 at ``IDLE_EXPLORE`` of that where the drafter catches up after idle steps.
- Learn without losing: while learned costs cannot yet tell depths apart (too few steps, or a
  fit whose standard error is large against its value), every phase keeps its default depth
  (exploration aside, which gives the fit its second depth); with confidences it drafts the
  default's positions and the gate only chooses which of them to verify, skipping a draft only
  if it would not pay even at ``1/PRIOR_SPREAD`` of the prior cost.  Once learned, a cost
  carries a band of one standard error: without confidences, a depth other than the default is
  taken only if it scores better across the whole band (a flat optimum keeps the default), and
  a shallower one only if the phase's rates from the data alone agree (the prior's pull toward
  1/2 is not evidence).  With confidences, a phase verifies and drafts its default until its
  calibrator has ``MIN_LABELS`` labels (before that its survivals are the prior's guess).
- Draft confidences (``confidence``; see confidence.py): once the drafter reports them, each
  step's depths come from the calibrated survival of each request's own drafts (``gate``), and
  ``depth`` only says how many positions to *draft*: the prefix whose summed recent gated gains,
  ``E[max(0, s_j - verify_cost)]``, beat most what drafting them costs (per position, and ``g``
  once; for a sequential drafter at the upper ends of their learned values beyond what the
  phase default forces; a parallel drafter such as DSpark drafts every position for free).  A position's gain starts from the
  most the phase's rates allow (optimistic: it is drafted and measured before it is dropped)
  and moves with each gated draft; exploration drafts one more position now and then.
"""

from __future__ import annotations

import math
import random
from operator import mul
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from dspark_dynamic.core.confidence import ConfidenceCalibrator, admit
from dspark_dynamic.core.phase import Phase

REQUEST_WINDOW = 12.0  # steps a request's own estimate remembers
REQUEST_BLEND = 2.0  # phase-estimate pseudo-observations in a request's estimate, at full persistence
MAX_REQUEST_BLEND = 400.0  # ... and when draft outcomes show no persistence at all


class Persistence:
    """Lag-1 autocorrelation of a request's consecutive first-draft outcomes (decayed).

    Near 0: outcomes are independent, a request's recent record is noise, trust the phase.
    Near 1: drafts come in easy/hard stretches, a request's recent record predicts its next step.
    """

    def __init__(self, window: float) -> None:
        self.keep = 1.0 - 1.0 / window
        self.n = self.sx = self.sy = self.sxy = self.sxx = 0.0

    def add(self, prev: float, cur: float) -> None:
        k = self.keep
        self.n = self.n * k + 1.0
        self.sx = self.sx * k + prev
        self.sy = self.sy * k + cur
        self.sxy = self.sxy * k + prev * cur
        self.sxx = self.sxx * k + prev * prev

    def rho(self) -> float:
        if self.n < 10.0:
            return 0.0
        mx, my = self.sx / self.n, self.sy / self.n
        var = self.sxx / self.n - mx * mx
        if var <= 1e-6:
            return 0.0
        return max(0.0, min(1.0, (self.sxy / self.n - mx * my) / var))

    def blend(self, rho: float | None = None) -> float:
        """Pseudo-observations of the phase estimate to mix into a request's own (``rho``: this
        persistence's ``rho()``, when the caller has it)."""
        return min(MAX_REQUEST_BLEND, REQUEST_BLEND / max(self.rho() if rho is None else rho, 1e-3))


@dataclass
class AcceptanceEstimate:
    """Decayed per-position success/observation counts."""

    positions: int
    window: float
    succ: list[float] = field(default_factory=list)
    seen: list[float] = field(default_factory=list)
    observations: int = 0

    def __post_init__(self) -> None:
        self.succ = [0.0] * self.positions
        self.seen = [0.0] * self.positions
        self.keep = 1.0 - 1.0 / self.window

    def update(self, verified: int, accepted: int, decay: bool = True) -> None:
        """Add one request-step; ``decay`` first ages the positions it observes."""
        if verified <= 0:
            return
        keep = self.keep if decay else 1.0
        seen, succ = self.seen, self.succ
        for j in range(min(verified, accepted + 1, self.positions)):
            seen[j] = seen[j] * keep + 1.0
            succ[j] = succ[j] * keep + (1.0 if j < accepted else 0.0)
        self.observations += 1

    def age(self) -> None:
        """Age every position by one step (a request's own evidence fades while unused)."""
        keep = self.keep
        seen, succ = self.seen, self.succ
        for j in range(self.positions):
            seen[j] *= keep
            succ[j] *= keep

    def rates(self, prior: list[float], prior_weight: float) -> list[float]:
        """Per-position rates; position j shrinks toward ``prior[j]`` or its predecessor's rate."""
        out: list[float] = []
        for j in range(self.positions):
            anchor = prior[j] if prior else (out[j - 1] if j else 0.5)
            out.append((self.succ[j] + prior_weight * anchor) / (self.seen[j] + prior_weight))
        return out


def _logit(p: float) -> float:
    p = 1e-4 if p < 1e-4 else (1.0 - 1e-4 if p > 1.0 - 1e-4 else p)
    return math.log(p / (1.0 - p))


def _offsets(context: tuple[list[float], list[float], float], own: AcceptanceEstimate) -> list[float]:
    """A request's recent deviation from its phase, per position, in log-odds (about 0 when its
    outcomes show no persistence: then its own record is noise); ``context``: the phase's rates,
    their log-odds and the weight of the phase's rates in the request's."""
    base, base_logits, blend = context
    out = []
    for succ, seen, b, lb in zip(own.succ, own.seen, base, base_logits):
        a = (succ + blend * b) / (seen + blend)
        a = 1e-4 if a < 1e-4 else (1.0 - 1e-4 if a > 1.0 - 1e-4 else a)
        out.append(math.log(a / (1.0 - a)) - lb)
    return out


def expected_tokens(rates: list[float], k: int) -> float:
    total, survive = 1.0, 1.0
    for a in rates[:k]:
        survive *= a
        total += survive
    return total


def best_depth(rates: list[float], lo: int, hi: int, per_token: float, fixed: float = 0.0) -> tuple[int, list[float]]:
    """The k in [lo, hi] maximising tokens per unit cost, and every k's score.

    ``per_token``: what one more verified (and drafted) draft adds to a step's cost, relative to
    a step at depth 0 (see ``StepCostModel.per_token``); ``fixed``: what any k > 0 pays once on
    top (``StepCostModel.fixed``, this request's share).
    """
    scores = [expected_tokens(rates, k) / (1.0 + per_token * k + (fixed if k else 0.0)) for k in range(hi + 1)]
    k = max(range(lo, hi + 1), key=lambda i: scores[i])
    return k, scores


def _invert(m: list[list[float]]) -> list[list[float]] | None:
    """Inverse of a small symmetric positive-definite matrix, computed in ``m`` (Gauss-Jordan,
    no pivoting: an SPD matrix needs none); None if a pivot vanishes."""
    n = len(m)
    for c in range(n):
        rc = m[c]
        pivot = rc[c]
        if not pivot > 1e-300:
            return None
        inv_p = 1.0 / pivot
        for j in range(n):
            rc[j] *= inv_p
        rc[c] = inv_p
        for r in range(n):
            if r != c:
                rr = m[r]
                f = rr[c]
                if f:
                    for j in range(n):
                        rr[j] -= f * rc[j]
                    rr[c] = -f * inv_p
    return m


class _Fit:
    """Weighted least squares on a subset of the shared statistics' features: the coefficients
    (over all features, 0 for one outside the subset), their covariance scale ``(X'WX)^-1`` and
    the weighted mean squared residual."""

    __slots__ = ("features", "coef", "p", "sq_err", "_at")

    def __init__(self, features: tuple[int, ...], total: int) -> None:
        self.features = features
        self.coef = [0.0] * total
        self.p: list[list[float]] | None = None
        self.sq_err = 0.0
        self._at = {f: i for i, f in enumerate(features)}

    def solve(self, xx: list[list[float]], xy: list[float], yy: float, weight: float, ridge: float) -> None:
        """``xx``, ``xy``, ``yy``: weighted sums of x x^T, x y and y^2 over all features;
        ``weight``: of 1."""
        idx = self.features
        a = [[xx[i][j] for j in idx] for i in idx]
        for i in range(len(idx)):
            a[i][i] += ridge
        p = _invert(a)
        if p is None:
            return
        self.p = p
        b = [xy[i] for i in idx]
        theta = [sum(map(mul, row, b)) for row in p]
        coef = [0.0] * len(xy)
        for f, t in zip(idx, theta):
            coef[f] = t
        self.coef = coef
        sse = yy - sum(map(mul, theta, b))  # at the optimum: y'Wy - theta'X'Wy
        self.sq_err = max(sse, 0.0) / max(weight - len(idx), 1.0)

    def se(self, *features: int) -> float:
        """Standard error of the sum of the given features' coefficients (inf before a solve, or
        for a feature outside the fit)."""
        p = self.p
        if p is None or any(f not in self._at for f in features):
            return math.inf
        at = [self._at[f] for f in features]
        var = sum(p[i][j] for i in at for j in at) * self.sq_err
        return math.sqrt(var) if var > 0.0 else 0.0


# features of a step, in the order of ``StepCostModel``'s statistics
_ONE, _REQUESTS, _VERIFIED, _DRAFTED, _ANY_VERIFIED, _DRAFTER_RAN = range(6)


def _step_features(r: float, v: float, d: float) -> tuple[float, ...]:
    return (1.0, r, v, d, 1.0 if v > 0 else 0.0, 1.0 if d > 0 else 0.0)


def _nonzero_terms(x: tuple[float, ...]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """A step shape's non-zero entries of x x^T (row-major upper triangle) and of x, by index."""
    n = len(x)
    outer, k = [], 0
    for i in range(n):
        for j in range(i, n):
            if x[i] * x[j]:
                outer.append((k, x[i] * x[j]))
            k += 1
    return outer, [(i, v) for i, v in enumerate(x) if v]


class StepCostModel:
    """A step's cost, given (prior) or learned from measured engine-step times.

    Given: in units of a plain one-request decode step, a step at depth k costs
    ``1 + draft + (verify + draft_token) * k``: ``draft`` for running the drafter at all,
    ``verify`` per verified token, ``draft_token`` per drafted position (0 for a parallel drafter
    such as DSpark, whose one pass drafts every position; > 0 for a sequential one such as
    draft_model or EAGLE, one forward per position).

    Learned, on decode-only steps (the adapter excludes prefill steps and idle time) after the
    first ``WARMUP`` (a fresh engine's first steps are slow for reasons no depth explains):
    ``step_seconds ~ t0 + t_req * requests + d * verified + c * drafted
    [+ f * any_verified] [+ g * drafter_ran]``, least squares with exponential forgetting over
    shared statistics (kept per step shape: a single stream has a handful of shapes, and a step
    adds to one), residuals clipped at a few mean absolute errors (a stray slow step on a shared
    machine does not drag the fit).  Four fits share the statistics, tried in this order:
    - *both steps*: ``f`` and ``g``;
    - *verify step*: ``f`` only: a step that verifies any draft pays ``f`` once on top (on the
      testbed's draft_model a first verified draft cost 7 ms and a second 4.8 ms: the step
      switches to the verification path, and the target reads more of its experts);
    - *drafter step*: ``g`` only: a step that drafts any position pays ``g`` once on top (where
      the idle drafter is skipped, its first pass and input preparation are paid once per
      drafting step, not per position: on the testbed 2-3 ms of a 10.5 ms step, and a second
      drafted position a few tenths of a millisecond);
    - *linear*: neither.
    A fit is used when its per-token cost ``d + c`` and each of its step terms is positive and
    pinned down (standard error below ``MAX_REL_SE`` of it, ``MAX_REL_SE_DRAFTER`` for ``g``: a
    step term the noise can fake would swing every first draft); a step term the data cannot separate from the intercept (every
    step verifies, or every step drafts) is never pinned, and a fit without it stands.
    ``verified`` and ``drafted`` move together when one request runs alone; only their sum is
    needed then.  All learned costs are in units of one request's share of a depth-0 step.

    ``drafter_catches_up``: the drafter skips its forward on steps that draft nothing and, on
    its next run, first runs over the positions it missed (``draft_model``,
    ``adapter/patches/drafter_skip.py``).  The first drafting step after one that drafted
    nothing then carries that catch-up (up to 64 positions), once per return to drafting: it
    says nothing about what drafting costs step after step, so it is counted (``caught_up``)
    and not fitted.  Fitted, sporadic drafting steps (probes from depth 0) priced every drafted
    position at up to three times its steady cost, and a policy that believed it stopped
    drafting even where 94 % of drafts were accepted.
    """

    FEATURES = 6  # 1, requests, verified drafts, drafted positions, any draft verified, drafter ran
    MIN_SAMPLES = 50
    CLIP = 3.0
    WARMUP = 16  # an engine's first decode steps (caches, allocator) say nothing about depth
    REFRESH = 128  # steps between solves once costs are learned (they move slowly; a solve takes ~50 us)
    REFRESH_LEARNING = 16  # ... and until then
    NEGLIGIBLE = 1e-9  # a step shape whose forgotten weight fell below this is dropped
    RIDGE = 1e-6  # keeps a direction the data never varied (collinear features) solvable
    MAX_REL_SE = 0.25  # a learned cost counts once its standard error is below this share of it
    # ... the drafter's step term once below this share: it is large against the gains it is
    # weighed with (a draft that pays at all gains ~1 - verify), so twice the noise still
    # leaves a well-accepted phase drafting, while leaving it out keeps a poorly accepted one
    # drafting at a loss (every drafting step pays it)
    MAX_REL_SE_DRAFTER = 0.5
    BAND_Z = 1.0  # a band of one standard error around a learned cost

    def __init__(self, verify: float, draft: float, draft_token: float = 0.0, learn: bool = True,
                 forget: float = 0.998, drafter_catches_up: bool = False) -> None:
        self.prior = (verify + draft_token) / (1.0 + draft)
        self.drafter_catches_up = drafter_catches_up
        self._last_drafted = -1  # the previous step's drafted positions (-1: none seen)
        self.caught_up = 0  # drafting steps not fitted: each followed a step that drafted nothing
        self.idle_fitted = 0  # fitted steps that drafted nothing (they show what the drafter costs)
        self.idle_recent = 0.0  # ... their count with the fit's forgetting: how much they still weigh
        self.prior_split = verify / (verify + draft_token) if verify + draft_token > 0 else 1.0
        self.learn = learn
        self.forget = forget
        # per step shape x = (requests, verified, drafted): sums of forget^-n * (1, seconds,
        # seconds^2) over its steps n; times forget^n they are the forgetting sums (one dict
        # update per step; x x^T, x * seconds and seconds^2 are formed per solve)
        self.shapes: dict[tuple[float, float, float], list[float]] = {}
        self._terms: dict[tuple[float, float, float], tuple] = {}  # per shape: ``_nonzero_terms``
        self._grow = 1.0 / forget
        self._weight = 1.0  # forget^-n since the last solve
        self._refresh = self.REFRESH_LEARNING
        n = self.FEATURES
        self.both_steps = _Fit((0, 1, 2, 3, 4, 5), n)
        self.verify_step = _Fit((0, 1, 2, 3, 4), n)
        self.drafter_step = _Fit((0, 1, 2, 3, 5), n)
        self.linear = _Fit((0, 1, 2, 3), n)
        self.fits = (self.both_steps, self.verify_step, self.drafter_step, self.linear)
        self._sums: tuple = ()  # the statistics of the last solve, for the fits solved on demand
        self._solved: set[_Fit] = set()  # the fits solved on them
        self.n = 0
        self.skipped = 0  # warm-up steps not fitted
        self.abs_err = 0.0
        self.requests = 1.0  # recent mean requests per step
        self.depths: set[int] = set()  # verified drafts per request (rounded) among the fitted shapes, as of the last solve
        self._view: CostView | None = None  # derived costs, until the next solve

    def update(self, seconds: float, verified_tokens: float, num_requests: int, draft_depth: int) -> None:
        """Adds one step to its shape's sums (every engine step, on the scheduler's critical
        path: O(1)); the fits are solved every ``REFRESH`` steps (``REFRESH_LEARNING`` until
        the costs are learned, and once at ``MIN_SAMPLES``)."""
        if not self.learn or num_requests <= 0 or seconds <= 0:
            return
        previous, self._last_drafted = self._last_drafted, draft_depth
        if self.drafter_catches_up and draft_depth > 0 and previous == 0:
            self.caught_up += 1
            return
        if self.skipped < self.WARMUP:
            self.skipped += 1
            return
        r, v, d = float(num_requests), float(verified_tokens), float(max(draft_depth, 0))
        if d == 0.0:
            self.idle_fitted += 1
            self.idle_recent = self.idle_recent * self.forget + 1.0
        else:
            self.idle_recent *= self.forget
        t0, t1, t2, t3, t4, t5 = self.both_steps.coef
        pred = t0 + t1 * r + t2 * v + t3 * d + (t4 if v > 0 else 0.0) + (t5 if d > 0 else 0.0)
        err = seconds - pred
        if self.n >= 20 and self.abs_err > 0:
            bound = self.CLIP * self.abs_err
            err = -bound if err < -bound else (bound if err > bound else err)
        self.abs_err = abs(err) if self.n == 0 else 0.98 * self.abs_err + 0.02 * abs(err)
        y = pred + err
        w = self._weight = self._weight * self._grow
        acc = self.shapes.get((r, v, d))
        if acc is None:
            self.shapes[(r, v, d)] = [w, w * y, w * y * y]
        else:
            acc[0] += w
            acc[1] += w * y
            acc[2] += w * y * y
        self.n += 1
        self.requests = 0.98 * self.requests + 0.02 * num_requests
        if self.n % self._refresh == 0 or self.n == self.MIN_SAMPLES:
            self._solve()

    def _statistics(self) -> tuple[list[list[float]], list[float], float]:
        """The forgetting sums of x x^T, x * seconds and seconds^2 (x: ``_step_features``);
        renormalises the shapes' sums to the current step and drops the negligible ones."""
        scale = 1.0 / self._weight
        self._weight = 1.0
        n = self.FEATURES
        upper = [0.0] * (n * (n + 1) // 2)  # x x^T, row-major upper triangle
        xy = [0.0] * n
        yy = 0.0
        terms = self._terms
        for key in list(self.shapes):
            acc = self.shapes[key]
            w, wy, wyy = acc[0] * scale, acc[1] * scale, acc[2] * scale
            if w < self.NEGLIGIBLE:
                del self.shapes[key]
                terms.pop(key, None)
                continue
            acc[0], acc[1], acc[2] = w, wy, wyy
            shape_terms = terms.get(key)
            if shape_terms is None:
                shape_terms = terms[key] = _nonzero_terms(_step_features(*key))
            outer, x = shape_terms
            for i, value in outer:
                upper[i] += w * value
            for i, value in x:
                xy[i] += wy * value
            yy += wyy
        xx = [[0.0] * n for _ in range(n)]
        k = 0
        for i in range(n):
            row = xx[i]
            for j in range(i, n):
                row[j] = xx[j][i] = upper[k]
                k += 1
        return xx, xy, yy

    def _solve(self) -> None:
        """Solves the fit with every term (its coefficients also predict each step, for the
        clipping) and, in ``_choose``, the others only as far as the first that is used."""
        xx, xy, yy = self._statistics()
        self._sums = (xx, xy, yy, xx[0][0], self.RIDGE)
        self.depths = {round(v / r) for r, v, _d in self.shapes}
        self.both_steps.solve(*self._sums)
        self._solved = {self.both_steps}
        self._view = None
        self._refresh = self.REFRESH if self.view().learned is not None else self.REFRESH_LEARNING

    def view(self) -> "CostView":
        """The costs in use, derived once per solve (the policy reads them every request-step)."""
        view = self._view
        if view is None:
            view = self._view = self._derive()
        return view

    def invalidate(self) -> None:
        """Derive the costs again at the next ``view`` (after the prior was changed)."""
        self._view = None

    def _choose(self) -> tuple[_Fit, float] | None:
        """(fit, base): the first fit whose per-token cost and step terms are positive and pinned
        down, and one request's share of its depth-0 step; None while not learned (too few
        steps, one depth only, or a per-token cost its standard error swamps)."""
        if not self.learn or self.n < self.MIN_SAMPLES or len(self.depths) < 2:
            return None
        b = max(self.requests, 1.0)
        limit = self.MAX_REL_SE
        for fit in self.fits:
            if fit not in self._solved:
                fit.solve(*self._sums)
                self._solved.add(fit)
            t = fit.coef
            base = (t[_ONE] + t[_REQUESTS] * b) / b
            per_token = t[_VERIFIED] + t[_DRAFTED]
            if base <= 0 or per_token <= 0 or fit.se(_VERIFIED, _DRAFTED) > limit * per_token:
                continue
            if _ANY_VERIFIED in fit.features and not self._pinned(fit, _ANY_VERIFIED, limit):
                continue
            if _DRAFTER_RAN in fit.features and not self._pinned(fit, _DRAFTER_RAN, self.MAX_REL_SE_DRAFTER):
                continue
            return fit, base
        return None

    @staticmethod
    def _pinned(fit: _Fit, feature: int, limit: float) -> bool:
        """The fit's coefficient of ``feature`` is positive, its standard error below ``limit`` of it."""
        value = fit.coef[feature]
        return value > 0 and fit.se(feature) <= limit * value

    def _derive(self) -> "CostView":
        requests = max(self.requests, 1.0)
        costs = self._choose()
        if costs is None:
            total = self.prior
            draft = total * (1.0 - self.prior_split)
            return CostView(not self.learn, None, total, total * self.prior_split,
                            draft, 0.0, 0.0, 0.0, 0.0, None, 0.0)
        fit, base = costs
        t = fit.coef
        d, c = t[_VERIFIED], t[_DRAFTED]
        total = max(0.0, min(10.0, (d + c) / base))
        if d > 0 and fit.se(_VERIFIED) <= self.MAX_REL_SE * d:
            # verify pinned down: a drafted position costs what the rest of the total says, or
            # nothing (once the drafter's step term is split off, a further drafted position can
            # cost too little to measure, and its estimate hovers around 0)
            verify = min(10.0, d / base)
            draft = max(0.0, total - verify)
            total = verify + draft
        else:
            verify = total * self.prior_split
            draft = total - verify
        half = self.BAND_Z * fit.se(_VERIFIED, _DRAFTED) / base
        fixed = min(10.0, t[_ANY_VERIFIED] / base)
        drafter = min(10.0, t[_DRAFTER_RAN] / base)
        drafter_high = min(10.0, drafter + self.BAND_Z * fit.se(_DRAFTER_RAN) / base) if drafter else 0.0
        return CostView(True, total, total, verify, draft, fixed, fixed / requests, drafter,
                        drafter / requests, (max(0.0, total - half), total + half), drafter_high / requests)

    def learned(self) -> float | None:
        """The learned per-token cost (verify + draft), or None while the fits cannot tell
        depths apart."""
        return self.view().learned

    @property
    def per_token(self) -> float:
        """Cost of one more draft at a step, relative to a depth-0 step's cost per request."""
        return self.view().per_token

    @property
    def fixed(self) -> float:
        """What a step pays once for verifying any draft, in units of one request's share of a
        depth-0 step (0 unless a fit with that step term is in use: a given cost has none)."""
        return self.view().fixed

    @property
    def drafter(self) -> float:
        """What a step pays once for drafting any position, same unit (0 unless a fit with that
        step term is in use)."""
        return self.view().drafter

    def split(self) -> tuple[float, float]:
        """(verify, draft) cost per token, in units of a depth-0 step per request (see
        ``CostView``)."""
        view = self.view()
        return view.verify, view.draft

    def band(self) -> tuple[float, float] | None:
        """The learned per-token cost +- one standard error (None while not learned): a depth
        other than the default is taken only if it wins across the band."""
        return self.view().band

    def describe(self) -> str:
        view = self.view()
        if view.learned is None:
            return f"cost/token={view.per_token:.3f} (given)"
        line = f"cost/token={view.per_token:.3f} (learned: verify {view.verify:.3f}, draft {view.draft:.3f}"
        if view.fixed:
            line += f", first verified draft +{view.fixed:.3f}"
        if view.drafter:
            line += f", drafter run +{view.drafter:.3f}"
        return line + ")"


class CostView(NamedTuple):
    """The costs a ``StepCostModel`` has derived since its last solve, in units of one
    request's share of a depth-0 step.

    ``verify`` / ``draft``: per verified draft and per drafted position.  ``verify`` is learned
    once its standard error is small against it, and ``draft`` is then the rest of the learned
    total (0 if that is negative: where the drafter's step term carries its fixed cost, a further
    drafted position may cost too little to measure); else the learned total is split as the
    prior splits it (a verify part near zero, or one the data cannot pin down, would swing the
    gate on noise).
    """

    known: bool  # given costs, or learned ones that tell depths apart
    learned: float | None  # the learned per-token cost, None while not learned
    per_token: float  # verify + draft: learned, else the prior
    verify: float
    draft: float
    fixed: float  # what a step pays once for verifying any draft (a fit with that term only)
    fixed_share: float  # ``fixed`` over the recent mean requests per step: one request's share
    drafter: float  # what a step pays once for drafting any position (a fit with that term only)
    drafter_share: float  # ``drafter`` over the recent mean requests per step
    band: tuple[float, float] | None  # ``learned`` +- ``BAND_Z`` standard errors
    drafter_share_high: float  # ``drafter_share`` plus ``BAND_Z`` of its standard errors (0 without)

    @property
    def draft_high(self) -> float:
        """``draft`` at the upper end of the band: what a choice that must not lose prices a
        drafted position at (with ``drafter_share_high`` for running the drafter at all)."""
        band = self.band
        return self.draft + (band[1] - self.per_token if band is not None else 0.0)

    @property
    def step_share(self) -> float:
        """What one request's share of a step pays once for any draft (verified and drafted)."""
        return self.fixed_share + self.drafter_share


class GatedGain:
    """A position's gated gain ``E[max(0, s - v)]`` over its recent drafts' survivals ``s``, kept
    usable when the verify cost ``v`` moves (it is learned, and early estimates swing): with the
    share of drafts above ``v`` and the mean ``v`` they were measured at, ``at(v')`` corrects to
    first order, ``gain - share * (v' - v)``, a lower bound on the gain at ``v'``.  (Stored
    against one ``v`` only, a gain measured while ``v`` was briefly high stayed low after it fell,
    and a position not drafted is never measured again.)"""

    __slots__ = ("gain", "share", "verify")

    def __init__(self, gain: float, share: float, verify: float) -> None:
        self.gain, self.share, self.verify = gain, share, verify

    def add(self, survival: float, verify: float, rate: float) -> None:
        if survival > verify:
            self.gain += rate * (survival - verify - self.gain)
            self.share += rate * (1.0 - self.share)
        else:
            self.gain -= rate * self.gain
            self.share -= rate * self.share
        self.verify += rate * (verify - self.verify)

    def at(self, verify: float) -> float:
        g = self.gain - self.share * (verify - self.verify)
        return g if g > 0.0 else 0.0


@dataclass
class _RequestState:
    estimate: AcceptanceEstimate
    depth: dict[Phase, int] = field(default_factory=dict)
    last_first: dict[Phase, float] = field(default_factory=dict)  # last first-draft outcome


class AdaptivePolicy:
    """Per-phase (and per-request) depth from acceptance and cost estimates."""

    def __init__(
        self,
        num_speculative_tokens: int,
        default_depths: dict[Phase, int],
        min_depth: int = 0,
        verify_cost_ratio: float = 0.5,
        draft_cost_ratio: float = 0.04,
        draft_token_cost_ratio: float = 0.0,
        learn_cost: bool = True,
        explore: float = 0.02,
        hysteresis: float = 0.01,
        prior_weight: float = 20.0,
        window: float = 400.0,
        confidence: bool = True,
        seed: int = 0,
        drafter_catches_up: bool = False,
    ) -> None:
        self.n = num_speculative_tokens
        self.min_depth = min(min_depth, self.n)
        # the phase defaults, within [min_depth, N]
        self.defaults = {p: min(max(k, self.min_depth), self.n) for p, k in default_depths.items()}
        self.learn_cost = learn_cost
        # a forward per drafted position (draft_model, EAGLE): a learned per-position cost of 0
        # then means the fit cannot see it, not a drafter that drafts every position in one pass
        self.sequential = draft_token_cost_ratio > 0.0
        self.explore = explore
        self.hysteresis = hysteresis
        self.prior_weight = prior_weight
        self.phase_estimates = {p: AcceptanceEstimate(self.n, window) for p in Phase}
        self._phase_rates: dict[Phase, list[float]] = {}  # phase_rates, until the next observation
        self._data_rates: dict[Phase, list[float]] = {}  # data_rates, likewise
        self.persistence = {p: Persistence(window) for p in Phase}
        self.requests: dict[str, _RequestState] = {}
        self.cost = StepCostModel(verify_cost_ratio, draft_cost_ratio, draft_token_cost_ratio, learn_cost,
                                  drafter_catches_up=drafter_catches_up)
        self._rng = random.Random(seed)
        # draft confidences: None = off; calibrators start learning when the first ones arrive
        self.calibrators = {p: ConfidenceCalibrator(self.n) for p in Phase} if confidence else None
        self.confidence_seen = False
        self.gains: dict[Phase, list[GatedGain | None]] = {p: [None] * self.n for p in Phase}
        self.offsets: dict[str, list[float]] = {}  # per request: the log-odds offsets of its last gate
        self._contexts: dict[Phase, tuple[int, tuple]] = {}  # per phase: (observations then, ``_context``)

    @classmethod
    def from_options(cls, options: Any, drafter_catches_up: bool = False) -> "AdaptivePolicy":
        a = options.adaptive
        return cls(
            options.num_speculative_tokens,
            {Phase.REASONING: options.reasoning_depth, Phase.ANSWER: options.answer_depth},
            min_depth=a.min_depth,
            verify_cost_ratio=a.verify_cost_ratio,
            draft_cost_ratio=a.draft_cost_ratio,
            draft_token_cost_ratio=a.draft_token_cost_ratio or 0.0,
            learn_cost=a.learn_cost,
            explore=a.explore,
            hysteresis=a.hysteresis,
            prior_weight=a.prior_weight,
            window=a.window,
            confidence=a.confidence,
            drafter_catches_up=drafter_catches_up,
        )

    # -- estimates ----------------------------------------------------------------------

    def phase_rates(self, phase: Phase) -> list[float]:
        """The phase's per-position rates (cached until the phase's next observation)."""
        rates = self._phase_rates.get(phase)
        if rates is None:
            rates = self._phase_rates[phase] = self.phase_estimates[phase].rates([], self.prior_weight)
        return rates

    def request_rates(self, phase: Phase, request_id: str | None) -> list[float]:
        base = self.phase_rates(phase)
        state = self.requests.get(request_id) if request_id is not None else None
        if state is None or state.estimate.observations == 0:
            return base
        return state.estimate.rates(base, self.persistence[phase].blend())

    # -- DepthPolicy --------------------------------------------------------------------

    def depth(self, phase: Phase, request_id: str | None = None) -> int:
        if self.calibrators is not None and self.confidence_seen:
            if request_id is not None:
                (self.requests.get(request_id) or self._state(request_id)).estimate.age()
            return self._draft_depth(phase)
        default = self.defaults[phase]
        costs = self.cost.view()
        if self.phase_estimates[phase].observations < self.prior_weight or not costs.known:
            # too little evidence, or costs that cannot yet tell depths apart (learn without
            # losing: a prior cost is a guess, and acting on it may cost more than the default)
            chosen = default
        else:
            rates = self.request_rates(phase, request_id)
            best, scores = best_depth(rates, self.min_depth, self.n, costs.per_token, costs.step_share)
            if best != default and not self._beats_default(rates, best, default, phase):
                best = default  # within the cost model's uncertainty: the default may be as good
            elif best < default and costs.learned is not None and not self._measured_through(default):
                best = default  # the default's depth is priced by extrapolation until a step shows it
            state = self._state(request_id)
            if state is not None:
                state.estimate.age()
            current = state.depth.get(phase, default) if state else default
            chosen = best if scores[best] > scores[current] * (1.0 + self.hysteresis) else current
            chosen = min(chosen, current + 1)  # climb one depth at a time: a probe costs least
            if state is not None:
                state.depth[phase] = chosen
        if self.explore and self._rng.random() < self._explore_rate(chosen):
            if chosen < self.n:
                return chosen + 1
            if self.learn_cost and chosen > self.min_depth:
                return chosen - 1
        return chosen

    # Where the drafter catches up after idle steps (``StepCostModel.drafter_catches_up``), a
    # probe from depth 0 also pays the catch-up: by a benchmark run's step-time trace a probe of
    # reasoning's drafts cost ~0.8 of a step (+5.5 ms catching up, +7.5 ms verifying for ~0.6
    # tokens), and at ``explore`` such probes ~2.5 % of reasoning's step time.  They run at this
    # share of ``explore`` there (the phase's gains and calibrator still hear from its drafts).
    IDLE_EXPLORE = 0.25

    def _explore_rate(self, depth: int) -> float:
        """How often a request-step at ``depth`` probes one position more (or one fewer)."""
        if depth == 0 and self.cost.drafter_catches_up:
            return self.explore * self.IDLE_EXPLORE
        return self.explore

    def _measured_through(self, depth: int) -> bool:
        """The learned costs have fitted steps that verify each of 1..depth drafts (per request)."""
        measured = self.cost.depths
        return all(k in measured for k in range(1, depth + 1))

    DATA_PRIOR = 1.0  # pseudo-observations in a phase's rates "from the data alone"

    def data_rates(self, phase: Phase) -> list[float]:
        """The phase's per-position rates with next to no prior: what its observations say (cached
        until the phase's next observation)."""
        rates = self._data_rates.get(phase)
        if rates is None:
            rates = self._data_rates[phase] = self.phase_estimates[phase].rates([], self.DATA_PRIOR)
        return rates

    def _beats_default(self, rates: list[float], k: int, default: int, phase: Phase | None = None) -> bool:
        """Depth ``k`` scores above ``default`` at both ends of the learned cost's band; for a
        ``k`` below the default, also at the phase's rates from the data alone.  (The prior pulls
        a phase's rates toward 1/2 with ``prior_weight`` pseudo-observations: just when a phase
        leaves its default, a 95 %-accepted answer read as ~0.72, depth 0 scored best, and the
        answer, drafting nothing, got no observations to correct it.)"""
        costs = self.cost.view()
        band = costs.band  # None while costs are given or not yet learned
        if band is None:
            return True
        f = costs.step_share
        fk, fd = (f if k else 0.0), (f if default else 0.0)
        for r in (rates, self.data_rates(phase) if phase is not None and k < default else None):
            if r is None:
                break
            e_k, e_d = expected_tokens(r, k), expected_tokens(r, default)
            for c in band:
                if not e_k / (1.0 + c * k + fk) > e_d / (1.0 + c * default + fd):
                    return False
        return True

    def observe(self, phase: Phase, verified: int, accepted: int, request_id: str | None = None) -> None:
        if verified <= 0:
            self._state(request_id)
            return
        self.phase_estimates[phase].update(verified, accepted)
        self._phase_rates.pop(phase, None)
        self._data_rates.pop(phase, None)
        state = self._state(request_id)
        if state is not None:
            state.estimate.update(verified, accepted, decay=False)
            first = 1.0 if accepted > 0 else 0.0
            prev = state.last_first.get(phase)
            if prev is not None:
                self.persistence[phase].add(prev, first)
            state.last_first[phase] = first

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int) -> None:
        self.cost.update(seconds, verified_tokens, num_requests, draft_depth)

    # -- draft confidences ----------------------------------------------------------------

    GAIN_RATE = 0.02  # memory of the per-position gated gain (about 50 request-steps)
    # Where the idle drafter is skipped, only a step that drafts nothing shows what running the
    # drafter costs; without one a fit extrapolates it, prices drafting at next to nothing, and
    # the policy drafts (and verifies) where plain decoding would win.  Until MIN_IDLE_FITTED
    # such steps are fitted, this share of request-steps drafts nothing (a bounded cost: they
    # stop once the fit has them, or once the policy drafts nothing on its own).
    IDLE_PROBE = 0.1
    MIN_IDLE_FITTED = 12
    # ... and later, where drafting nets a phase less than MARGINAL of a step (so a probe costs
    # little), while the fitted idle steps weigh less than MIN_IDLE_RECENT in the fit's
    # forgetting: the machine's speed drifts, and idle steps seen only early priced every later
    # drafting step against a depth-0 step measured while the machine was slow (dm6: a depth-0
    # step at 14.5 ms against the 11.2 ms it then took, drafting learned as free, and reasoning
    # drafting, at a loss, on 62 % of its steps)
    MIN_IDLE_RECENT = 8.0
    MARGINAL = 0.3
    # A phase's calibrator with fewer labels than this is its prior's guess (slope 0.5 on the
    # feature): gated on it, a phase seen for the first time (the first answer) verified nothing
    # once the learned verify cost was ~0.6, got no labels and stopped drafting.  Until then the
    # phase verifies, and drafts, what its default says (learn without losing).
    MIN_LABELS = 16

    PRIOR_SPREAD = 2.0  # a given (prior) cost may be off by this factor either way

    def _draft_depth(self, phase: Phase) -> int:
        """Positions to draft for a request's next step: the prefix whose summed gated gains, less
        what drafting them costs (per position, and once for running the drafter at all), is
        largest.  Within the phase default a position is drafted while it was never gated, or
        while the learned costs have not yet seen a step that verifies that many drafts (a fit
        over shallower steps prices a deeper one by extrapolation: on the testbed a fit over
        depths 0-1 charged the second draft the first one's switch to the verification path,
        three times its cost, and the answer stopped drafting for good).  Beyond that forced
        prefix a sequential drafter's position must pay at the upper ends of the learned costs
        (learn without losing: on the testbed reasoning's drafts are near break-even, and a
        per-position cost the fit put at 0.06-0.12 of a step against a true 0.15 kept reasoning
        drafting at a loss).  A parallel drafter's positions, drafted in one pass, cost little
        apart, and their learned cost's band is about as wide as itself: at its upper end DFlash
        reasoned at depth 0 on 40 % of its steps, where drafting paid.  A never-gated position
        counts the most the phase's acceptance rates allow."""
        costs = self.cost.view()
        verify, draft, drafter = costs.verify, costs.draft, costs.drafter_share
        value = math.inf  # what drafting the chosen prefix nets against drafting nothing
        if not costs.known:
            depth = self.defaults[phase]  # learn without losing: draft what the phase default does
        elif not self.sequential and draft <= 0.0 and drafter <= 0.0:
            depth = self.n  # a parallel drafter drafts every position in one pass, at no extra cost
        else:
            default = self.defaults[phase]
            first = verify + costs.fixed_share  # the first verified draft also pays the step term
            gains = self.gains[phase]
            learned = costs.learned is not None
            measured = self.cost.depths
            # learn without losing: through the default's deepest unmeasured position (all of the
            # default while the phase's calibrator is fresh)
            if self.calibrators[phase].report.labels < self.MIN_LABELS:
                forced = min(default, len(gains))
            else:
                forced = 0
                for j in range(min(default, len(gains))):
                    if gains[j] is None or (learned and j + 1 not in measured):
                        forced = j + 1
            # net(k): the first k positions' gains less their costs (for a sequential drafter at
            # the upper ends beyond the forced prefix); drafting nothing nets 0, and a forced
            # prefix is the baseline that further positions must beat
            draft_high, drafter_high = ((costs.draft_high, costs.drafter_share_high) if self.sequential
                                        else (draft, drafter))
            depth, net, best = forced, -(drafter if forced else drafter_high), 0.0
            for j, record in enumerate(gains):
                v = first if j == 0 else verify
                if record is None:  # never gated beyond the default: what the phase's rates allow
                    gain = self._rate_survival(phase, j) * (1.0 - v) if v < 1.0 else 0.0
                else:
                    gain = record.at(v)
                net += gain - (draft if j < forced else draft_high)
                if j + 1 == forced:
                    best = net
                elif j + 1 > forced and net > best:
                    depth, best = j + 1, net
            value = best
        if depth < self.min_depth:
            depth = self.min_depth
        if self.explore:
            # probes: one position more keeps gains measured; one fewer keeps a step that drafts
            # less in the cost fit, so it can tell drafting from the intercept (where the idle
            # drafter is skipped, a step that drafts nothing is the only shape that shows it)
            r = self._rng.random()
            if r < self._explore_rate(depth):
                if depth < self.n:
                    depth += 1
            elif (r < 2.0 * self.explore and depth > self.min_depth
                  and (self.sequential or draft > 0.0 or drafter > 0.0)):
                depth -= 1  # (a parallel drafter's positions cost nothing apart: no fewer)
            elif r < 2.0 * self.explore + self.IDLE_PROBE and depth > self.min_depth and self._idle_probe_due(value):
                depth = self.min_depth  # see IDLE_PROBE
        return depth

    def _idle_probe_due(self, value: float) -> bool:
        """A step that drafts nothing is wanted for the cost fit (see ``IDLE_PROBE``): none fitted
        yet, or too few recent ones where drafting nets ``value < MARGINAL``."""
        cost = self.cost
        if not cost.drafter_catches_up:
            return False
        return cost.idle_fitted < self.MIN_IDLE_FITTED or (cost.idle_recent < self.MIN_IDLE_RECENT
                                                            and value < self.MARGINAL)

    def _rate_survival(self, phase: Phase, position: int) -> float:
        """The chance that drafts 1..position+1 are all accepted, at the higher of the phase's
        rates and its rates from the data alone (optimistic: the prior's pull toward 1/2 does not
        stop a well-accepted phase from being drafted and measured)."""
        survive = 1.0
        for a, b in zip(self.phase_rates(phase)[: position + 1], self.data_rates(phase)):
            survive *= a if a > b else b
        return survive

    def _first_gain(self, phase: Phase, verify: float, position: int) -> GatedGain:
        """What a position's gain starts from before its first gated draft: the most it can be at
        the phase's rates (its drafts either sure or hopeless: ``survival * (1 - verify)``), so
        every position is drafted and measured before it is dropped."""
        survive = self._rate_survival(phase, position)
        return GatedGain(survive * (1.0 - verify) if verify < 1.0 else 0.0, survive, verify)

    def gate(self, items: list[tuple[Phase, str, list[float], int]], uniform: str | None = None) -> list[int]:
        """This step's depths from each request's own draft confidences.

        ``items``: (phase, request id, features of its drafts, drafts available).  Returns one
        depth per item (at most its drafts available).
        """
        self.confidence_seen = True
        costs = self.cost.view()
        verify, draft, known = costs.verify, costs.draft, costs.known
        fixed = costs.fixed if known else 0.0
        first = verify + fixed / len(items) if items else verify  # the first draft's verify cost
        survivals = []
        requests, last_offsets, calibrators = self.requests, self.offsets, self.calibrators
        min_labels = self.MIN_LABELS
        for phase, req, features, available in items:
            offsets = None
            state = requests.get(req)
            if state is not None and state.estimate.observations:
                context = self._context(phase)
                if context:  # outcomes persist: the request's own record shifts its probabilities
                    offsets = _offsets(context, state.estimate)
            last_offsets[req] = offsets
            s = calibrators[phase].survival(features[:available] if available < len(features) else features, offsets)
            if calibrators[phase].report.labels < min_labels:  # fresh (``MIN_LABELS``): its
                # default's drafts count as sure, the rest as hopeless
                s = [1.0] * min(self.defaults[phase], len(s))
            elif (draft > 0.0 or costs.drafter > 0.0) and known:  # what drafting each position gains (a parallel drafter
                # drafts all anyway; gains against a prior cost would outlive it by ~50 steps)
                gains = self.gains[phase]
                for j, sj in enumerate(s):
                    v = first if j == 0 else verify
                    record = gains[j]
                    if record is None:  # the first gated draft moves the starting gain, not replaces it
                        record = gains[j] = self._first_gain(phase, v, j)
                    record.add(sj, v, self.GAIN_RATE)
            if not known:
                s = s[: self.defaults[phase]]
            survivals.append(s)
        # learn without losing: a prior cost is trusted within a factor PRIOR_SPREAD, so until
        # costs are learned a default's draft is skipped only if it does not pay at the low end
        depths = admit(survivals, verify if known else verify / self.PRIOR_SPREAD, uniform, fixed)
        min_depth = self.min_depth
        explore = self.explore if uniform is None else 0.0
        if not min_depth and not explore:
            return depths
        rng = self._rng
        for i, ((_phase, _req, _f, available), s) in enumerate(zip(items, survivals)):
            k = depths[i]
            if k < min_depth:
                k = min(min_depth, available)
            if explore and k < len(s) and rng.random() < explore:
                k += 1  # keep labels coming from below the threshold: the fit stays honest
            depths[i] = k
        return depths

    CONTEXT_REFRESH = 8  # phase observations between refreshes of a phase's offset context

    def _context(self, phase: Phase) -> tuple:
        """What a request's offsets are measured against (``_offsets``): the phase's rates, their
        log-odds and their weight in the request's own; () while the phase's outcomes show no
        persistence.  Refreshed every ``CONTEXT_REFRESH`` observations of the phase (its rates and
        persistence move by about 1/window per observation), not per request-step."""
        seen = self.phase_estimates[phase].observations
        cached = self._contexts.get(phase)
        if cached is not None and seen - cached[0] < self.CONTEXT_REFRESH:
            return cached[1]
        persistence = self.persistence[phase]
        rho = persistence.rho()
        context: tuple = ()
        if rho > 0.0:
            base = self.phase_rates(phase)
            context = (base, [_logit(b) for b in base], persistence.blend(rho))
        self._contexts[phase] = (seen, context)
        return context

    def observe_confidence(self, phase: Phase, features: list[float], verified: int, accepted: int,
                           request_id: str | None = None) -> None:
        offsets = self.offsets.pop(request_id, None) if request_id is not None else None
        self.calibrators[phase].observe(features, verified, accepted, offsets)

    def forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.offsets.pop(request_id, None)

    def describe(self, phase: Phase) -> str:
        rates = ", ".join(f"{a:.2f}" for a in self.phase_rates(phase))
        costs = self.cost.view()
        k, _ = best_depth(self.phase_rates(phase), self.min_depth, self.n, costs.per_token, costs.step_share)
        line = (
            f"adaptive: accept/pos=[{rates}] best depth={k} persistence={self.persistence[phase].rho():.2f} "
            f"{self.cost.describe()} observations={self.phase_estimates[phase].observations}"
        )
        if self.calibrators is not None and self.confidence_seen:
            line += f"; {self.calibrators[phase].describe()}"
        return line

    def _state(self, request_id: str | None) -> _RequestState | None:
        if request_id is None:
            return None
        state = self.requests.get(request_id)
        if state is None:
            state = _RequestState(AcceptanceEstimate(self.n, REQUEST_WINDOW))
            self.requests[request_id] = state
        return state

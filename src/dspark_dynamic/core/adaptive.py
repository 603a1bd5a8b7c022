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
  ``StepCostModel``) once the data spans several depths, with a step term ``f`` (what a step
  pays once for verifying any draft) when the data shows one: ``C(k) = 1 + c*k + f*[k > 0]``.
- The chosen depth maximises ``E(k) / C(k)`` over ``[min_depth, N]``, with hysteresis: a request
  moves from its current depth only for a relative gain above ``hysteresis``.  Until a phase has
  ``prior_weight`` observations the phase defaults (``reasoning_depth`` / ``answer_depth``) apply.
- Exploration: with probability ``explore`` a step uses one more draft than chosen (one fewer
  at the maximum, when costs are learned), so the estimates of deeper positions stay fresh.
- Learn without losing: while learned costs cannot yet tell depths apart (too few steps, or a
  fit whose standard error is large against its value), every phase keeps its default depth
  (exploration aside, which gives the fit its second depth); with confidences it drafts the
  default's positions and the gate only chooses which of them to verify, skipping a draft only
  if it would not pay even at ``1/PRIOR_SPREAD`` of the prior cost.  Once learned, a cost
  carries a band of one standard error: without confidences, a depth other than the default is
  taken only if it scores better across the whole band (a flat optimum keeps the default).
- Draft confidences (``confidence``; see confidence.py): once the drafter reports them, each
  step's depths come from the calibrated survival of each request's own drafts (``gate``), and
  ``depth`` only says how many positions to *draft*: position j is drafted while its recent
  gated gain, ``E[max(0, s_j - verify_cost)]``, beats what drafting it costs (a parallel
  drafter such as DSpark drafts every position for free).  A position's gain starts from the
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
    """Weighted least squares on the first ``size`` features of shared statistics: the
    coefficients, their covariance scale ``(X'WX)^-1`` and the weighted mean squared residual."""

    __slots__ = ("size", "theta", "p", "sq_err")

    def __init__(self, size: int) -> None:
        self.size = size
        self.theta = [0.0] * size
        self.p: list[list[float]] | None = None
        self.sq_err = 0.0

    def solve(self, xx: list[list[float]], xy: list[float], yy: float, weight: float, ridge: float) -> None:
        """``xx``, ``xy``, ``yy``: weighted sums of x x^T, x y and y^2; ``weight``: of 1."""
        k = self.size
        a = [row[:k] for row in xx[:k]]
        for i in range(k):
            a[i][i] += ridge
        p = _invert(a)
        if p is None:
            return
        self.p = p
        xy = xy[:k]
        theta = self.theta = [sum(map(mul, row, xy)) for row in p]
        sse = yy - sum(map(mul, theta, xy))  # at the optimum: y'Wy - theta'X'Wy
        self.sq_err = max(sse, 0.0) / max(weight - k, 1.0)

    def se(self, i: int, j: int | None = None) -> float:
        """Standard error of coefficient ``i``, or of the sum of coefficients ``i`` and ``j``."""
        p = self.p
        if p is None:
            return math.inf
        var = p[i][i] if j is None else p[i][i] + p[j][j] + 2.0 * p[i][j]
        var *= self.sq_err
        return math.sqrt(var) if var > 0.0 else 0.0


class StepCostModel:
    """A step's cost, given (prior) or learned from measured engine-step times.

    Given: in units of a plain one-request decode step, a step at depth k costs
    ``1 + draft + (verify + draft_token) * k``: ``draft`` for running the drafter at all,
    ``verify`` per verified token, ``draft_token`` per drafted position (0 for a parallel drafter
    such as DSpark, whose one pass drafts every position; > 0 for a sequential one such as
    draft_model or EAGLE, one forward per position).

    Learned, on decode-only steps (the adapter excludes prefill steps and idle time) after the
    first ``WARMUP`` (a fresh engine's first steps are slow for reasons no depth explains):
    ``step_seconds ~ t0 + t_req * requests + d * verified + c * drafted [+ f * any_verified]``,
    least squares with exponential forgetting over shared statistics (kept per step shape: a
    single stream has a handful of shapes, and a step adds to one), residuals clipped at a few
    mean absolute errors (a stray slow step on a shared machine does not drag the fit).  Two
    fits share the statistics:
    - *linear* (no ``f``): every verified draft costs ``d``;
    - *stepped*: a step that verifies any draft pays ``f`` once on top (on the testbed's
      draft_model a first verified draft cost 7 ms and a second 4.8 ms: the step switches to
      the verification path, and the target reads more of its experts).  It is used only when
      ``f`` is positive and pinned down (its standard error below ``MAX_REL_SE`` of it: a step
      term the noise can fake would swing every first draft); otherwise the linear fit stands.
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

    FEATURES = 5  # 1, requests, verified drafts, drafted positions, any draft verified
    MIN_SAMPLES = 50
    CLIP = 3.0
    WARMUP = 16  # an engine's first decode steps (caches, allocator) say nothing about depth
    REFRESH = 64  # steps between solves once costs are learned (they move slowly; a solve takes ~30 us)
    REFRESH_LEARNING = 16  # ... and until then
    NEGLIGIBLE = 1e-9  # a step shape whose forgotten weight fell below this is dropped
    RIDGE = 1e-6  # keeps a direction the data never varied (collinear features) solvable
    MAX_REL_SE = 0.25  # a learned cost counts once its standard error is below this share of it
    BAND_Z = 1.0  # a band of one standard error around a learned cost

    def __init__(self, verify: float, draft: float, draft_token: float = 0.0, learn: bool = True,
                 forget: float = 0.998, drafter_catches_up: bool = False) -> None:
        self.prior = (verify + draft_token) / (1.0 + draft)
        self.drafter_catches_up = drafter_catches_up
        self._last_drafted = -1  # the previous step's drafted positions (-1: none seen)
        self.caught_up = 0  # drafting steps not fitted: each followed a step that drafted nothing
        self.prior_split = verify / (verify + draft_token) if verify + draft_token > 0 else 1.0
        self.learn = learn
        self.forget = forget
        # per step shape x = (requests, verified, drafted): sums of forget^-n * (1, seconds,
        # seconds^2) over its steps n; times forget^n they are the forgetting sums (one dict
        # update per step; the 21 sums of x x^T, x * seconds and seconds^2 are formed per solve)
        self.shapes: dict[tuple[float, float, float], list[float]] = {}
        self._grow = 1.0 / forget
        self._weight = 1.0  # forget^-n since the last solve
        self._refresh = self.REFRESH_LEARNING
        self.linear = _Fit(self.FEATURES - 1)
        self.stepped = _Fit(self.FEATURES)
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
        a = 1.0 if verified_tokens > 0 else 0.0
        t0, t1, t2, t3, t4 = self.stepped.theta
        pred = t0 + t1 * r + t2 * v + t3 * d + t4 * a
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

    def _statistics(self) -> list[float]:
        """The forgetting sums of the upper triangle of x x^T (x = 1, requests, verified,
        drafted, any verified), of x * seconds and of seconds^2, flat; renormalises the shapes'
        sums to the current step and drops the negligible ones."""
        scale = 1.0 / self._weight
        self._weight = 1.0
        s = [0.0] * 21
        for key in list(self.shapes):
            acc = self.shapes[key]
            w, wy, wyy = acc[0] * scale, acc[1] * scale, acc[2] * scale
            if w < self.NEGLIGIBLE:
                del self.shapes[key]
                continue
            acc[0], acc[1], acc[2] = w, wy, wyy
            r, v, d = key
            a = 1.0 if v > 0 else 0.0
            for i, p in enumerate((1.0, r, v, d, a, r * r, r * v, r * d, r * a, v * v, v * d, v * a,
                                   d * d, d * a, a)):
                s[i] += w * p
            for i, p in enumerate((1.0, r, v, d, a), 15):
                s[i] += wy * p
            s[20] += wyy
        return s

    def _solve(self) -> None:
        s = self._statistics()
        xx = [[s[0], s[1], s[2], s[3], s[4]],
              [s[1], s[5], s[6], s[7], s[8]],
              [s[2], s[6], s[9], s[10], s[11]],
              [s[3], s[7], s[10], s[12], s[13]],
              [s[4], s[8], s[11], s[13], s[14]]]
        xy, yy, weight = s[15:20], s[20], s[0]
        self.depths = {round(v / r) for r, v, _d in self.shapes}
        self.linear.solve(xx, xy, yy, weight, self.RIDGE)
        self.stepped.solve(xx, xy, yy, weight, self.RIDGE)
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

    def _choose(self) -> tuple[_Fit, float, float] | None:
        """(fit, base, fixed): the fit in use, one request's share of its depth-0 step, and its
        step term ``f`` in units of ``base`` (0 for the linear fit); None while not learned
        (too few steps, one depth only, or a per-token cost its standard error swamps)."""
        if not self.learn or self.n < self.MIN_SAMPLES or len(self.depths) < 2:
            return None
        b = max(self.requests, 1.0)
        for fit in (self.stepped, self.linear):
            t = fit.theta
            base = (t[0] + t[1] * b) / b
            per_token = t[2] + t[3]
            if base <= 0 or per_token <= 0 or fit.se(2, 3) > self.MAX_REL_SE * per_token:
                continue
            if fit is self.stepped:
                if t[4] <= 0 or fit.se(4) > self.MAX_REL_SE * t[4]:  # not pinned: the linear fit stands
                    continue
                return fit, base, t[4] / base
            return fit, base, 0.0
        return None

    def _derive(self) -> "CostView":
        requests = max(self.requests, 1.0)
        costs = self._choose()
        if costs is None:
            total = self.prior
            return CostView(not self.learn, None, total, total * self.prior_split,
                            total * (1.0 - self.prior_split), 0.0, 0.0, None, False)
        fit, base, fixed = costs
        t = fit.theta
        total = max(0.0, min(10.0, (t[2] + t[3]) / base))
        d, c = t[2], t[3]
        if fit.se(2) <= self.MAX_REL_SE * d and fit.se(3) <= self.MAX_REL_SE * c:
            verify = max(0.0, min(total, d / base))
        else:
            verify = total * self.prior_split
        half = self.BAND_Z * fit.se(2, 3) / base
        fixed = min(10.0, fixed)
        return CostView(True, total, total, verify, total - verify, fixed, fixed / requests,
                        (max(0.0, total - half), total + half), fit is self.stepped)

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
        depth-0 step (0 unless the stepped fit is in use: a given cost has no step term)."""
        return self.view().fixed

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
        return line + (f", first verified draft +{view.fixed:.3f})" if view.stepped else ")")


class CostView(NamedTuple):
    """The costs a ``StepCostModel`` has derived since its last solve, in units of one
    request's share of a depth-0 step.

    ``verify`` / ``draft``: per verified draft and per drafted position.  Learned separately once
    verified drafts and drafted positions have varied apart (a confidence gate verifies fewer than
    were drafted) and each part's standard error is small against its own value; else the learned
    total split as the prior splits it (a part near zero, or one the data cannot pin down, would
    swing the gate or the drafting decision on noise).
    """

    known: bool  # given costs, or learned ones that tell depths apart
    learned: float | None  # the learned per-token cost, None while not learned
    per_token: float  # verify + draft: learned, else the prior
    verify: float
    draft: float
    fixed: float  # what a step pays once for verifying any draft (stepped fit only)
    fixed_share: float  # ``fixed`` over the recent mean requests per step: one request's share
    band: tuple[float, float] | None  # ``learned`` +- ``BAND_Z`` standard errors
    stepped: bool  # the stepped fit is in use


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
        self.explore = explore
        self.hysteresis = hysteresis
        self.prior_weight = prior_weight
        self.phase_estimates = {p: AcceptanceEstimate(self.n, window) for p in Phase}
        self._phase_rates: dict[Phase, list[float]] = {}  # phase_rates, until the next observation
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
            best, scores = best_depth(rates, self.min_depth, self.n, costs.per_token, costs.fixed_share)
            if best != default and not self._beats_default(rates, best, default):
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
        if self.explore and self._rng.random() < self.explore:
            if chosen < self.n:
                return chosen + 1
            if self.learn_cost and chosen > self.min_depth:
                return chosen - 1
        return chosen

    def _measured_through(self, depth: int) -> bool:
        """The learned costs have fitted steps that verify each of 1..depth drafts (per request)."""
        measured = self.cost.depths
        return all(k in measured for k in range(1, depth + 1))

    def _beats_default(self, rates: list[float], k: int, default: int) -> bool:
        """Depth ``k`` scores above ``default`` at both ends of the learned cost's band."""
        costs = self.cost.view()
        band = costs.band  # None while costs are given or not yet learned
        if band is None:
            return True
        e_k, e_d = expected_tokens(rates, k), expected_tokens(rates, default)
        f = costs.fixed_share
        return all(e_k / (1.0 + c * k + (f if k else 0.0)) > e_d / (1.0 + c * default + (f if default else 0.0))
                   for c in band)

    def observe(self, phase: Phase, verified: int, accepted: int, request_id: str | None = None) -> None:
        if verified <= 0:
            self._state(request_id)
            return
        self.phase_estimates[phase].update(verified, accepted)
        self._phase_rates.pop(phase, None)
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
    PRIOR_SPREAD = 2.0  # a given (prior) cost may be off by this factor either way

    def _draft_depth(self, phase: Phase) -> int:
        """Positions to draft for a request's next step: the leading positions whose gated gain
        beats their drafting cost.  Within the phase default a position is drafted while it was
        never gated, or while the learned costs have not yet seen a step that verifies that many
        drafts (a fit over shallower steps prices a deeper one by extrapolation: on the testbed a
        fit over depths 0-1 charged the second draft the first one's switch to the verification
        path, three times its cost, and the answer stopped drafting for good).  Beyond the default
        a never-gated position is drafted if the most the phase's acceptance rates allow beats
        the cost."""
        costs = self.cost.view()
        verify, draft = costs.verify, costs.draft
        if not costs.known:
            depth = self.defaults[phase]  # learn without losing: draft what the phase default does
        elif draft <= 0.0:
            depth = self.n  # a parallel drafter drafts every position in one pass
        else:
            depth = 0
            default = self.defaults[phase]
            first = verify + costs.fixed_share  # the first verified draft also pays the step term
            gains = self.gains[phase]
            learned = costs.learned is not None
            measured = self.cost.depths
            forced = 0  # learn without losing: through the default's deepest unmeasured position
            for j in range(min(default, len(gains))):
                if gains[j] is None or (learned and j + 1 not in measured):
                    forced = j + 1
            for j, record in enumerate(gains):
                v = first if j == 0 else verify
                if j < forced:
                    depth = j + 1
                    continue
                if record is None:  # never gated beyond the default: drafted if the phase's rates allow
                    gain = self._rate_survival(phase, j) * (1.0 - v) if v < 1.0 else 0.0
                else:
                    gain = record.at(v)
                if gain <= draft:
                    break
                depth = j + 1
        if depth < self.min_depth:
            depth = self.min_depth
        if self.explore:
            # probes: one position more keeps gains measured; one fewer keeps a step that drafts
            # less in the cost fit, so it can tell drafting from the intercept (where the idle
            # drafter is skipped, a step that drafts nothing is the only shape that shows it)
            r = self._rng.random()
            if r < self.explore:
                if depth < self.n:
                    depth += 1
            elif r < 2.0 * self.explore and depth > self.min_depth and draft > 0.0:
                depth -= 1  # (a parallel drafter's positions cost nothing apart: no fewer)
        return depth

    def _rate_survival(self, phase: Phase, position: int) -> float:
        """The phase's rates' chance that drafts 1..position+1 are all accepted."""
        survive = 1.0
        for a in self.phase_rates(phase)[: position + 1]:
            survive *= a
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
        for phase, req, features, available in items:
            offsets = None
            state = requests.get(req)
            if state is not None and state.estimate.observations:
                context = self._context(phase)
                if context:  # outcomes persist: the request's own record shifts its probabilities
                    offsets = _offsets(context, state.estimate)
            last_offsets[req] = offsets
            s = calibrators[phase].survival(features[:available] if available < len(features) else features, offsets)
            if draft > 0.0 and known:  # what drafting each position gains (a parallel drafter
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
        k, _ = best_depth(self.phase_rates(phase), self.min_depth, self.n, costs.per_token, costs.fixed_share)
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

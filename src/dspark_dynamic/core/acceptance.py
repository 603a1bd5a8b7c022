"""Acceptance: how likely a request's next drafts are to be accepted (pure logic).

A request-step that verified ``k`` drafts and accepted ``m`` observes positions
``1..min(k, m+1)``: successes at ``1..m`` and a failure at ``m+1`` (when ``m < k``).

- ``PositionRates``, per phase: ``a_j = P(draft j accepted | drafts 1..j-1 accepted)``, a Beta
  posterior per position: the recent outcomes, fading with every request-step of the phase
  (``1 - 1/window``), observed or not, plus ``prior_weight`` pseudo-observations of an anchor:
  for the first position its own recent rate with one pseudo-observation of ``1/2``, for a later
  one the rate of the position before it.  A phase that stopped drafting keeps its estimate
  while its evidence is fresh, then returns to ``1/2`` and grows uncertain, so a draw from its
  posterior (``sample``) says drafting pays now and then: exploration that stops by itself while
  the evidence is fresh, costs little where it is frequent (near break-even), and never ends
  for good (a phase whose first outcomes were poor is not a dead spot).
- ``Persistence``, per phase: the lag-1 autocorrelation ``rho`` of consecutive first-draft
  outcomes, 0 unless above two of its standard errors, shrunk toward 0 by ``prior_weight``
  pseudo-observations: 0 for independent outcomes, near 1 where drafts come in easy and hard
  stretches.
- ``RequestRecord``: a request's own outcomes over its last ``REQUEST_MEMORY`` steps, and a
  draw of its own rates (``sample_offsets``: a Beta posterior centred on its phase's, as strong
  as the phase's outcomes are independent), as log-odds shifts of the phase's rates.
- ``GateSample``, per phase: the last ``RESERVOIR`` gated drafts, priced with the phase's drawn
  calibration, so the drafting decision can price a position at what gating it would gain,
  ``E[(s - v)^+]`` at a verify price ``v``, under a request's own shifts.

Invariants: every rate lies in ``(0, 1)``; a position never observed has its predecessor's rate;
a sample is the mean when the posterior is a point (``prior_weight`` 0 and no decay).
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from operator import mul

from dspark_dynamic.core.draws import normals

REQUEST_MEMORY = 12.0  # steps a request's own record remembers (tuned on the drift workload)
_GROW = 1.0 / (1.0 - 1.0 / REQUEST_MEMORY)
# Gated drafts per phase and position the drafting decision reads: a sample size, not a tuned
# constant. The decisions measure the same from 16 to 64 (the simulator's noisy machines); fewer
# lose (8: 0.3 %, 4: 0.7 %, seed-like workload) and a read's host time grows with it: the smallest.
RESERVOIR = 16
_EPS = 1e-4


def logit(p: float) -> float:
    p = _EPS if p < _EPS else (1.0 - _EPS if p > 1.0 - _EPS else p)
    return math.log(p / (1.0 - p))


def _count(succ: list[float], seen: list[float], w: float, verified: int, accepted: int) -> None:
    """Add one request-step's outcomes with weight ``w``: positions ``1..m`` seen and accepted,
    position ``m+1`` seen and rejected when ``m < k`` (``k`` verified, ``m`` accepted)."""
    n = len(seen)
    for j in range(accepted if accepted < n else n):
        seen[j] += w
        succ[j] += w
    if accepted < verified and accepted < n:
        seen[accepted] += w


def sigmoid(z: float) -> float:
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


class PositionRates:
    """Per-position Beta posteriors with forgetting in request-steps (see the module docstring).
    The recent counts are kept multiplied by ``1 / keep`` per request-step since the last rescale
    (``_w``: an outcome's weight now), so a request-step costs one multiplication, not a pass
    over the counts; divided by ``_w`` they are the faded counts."""

    __slots__ = ("n", "prior_weight", "grow", "succ", "seen", "observations", "_w", "_means")

    def __init__(self, positions: int, prior_weight: float = 20.0, window: float = 400.0) -> None:
        self.n = positions
        self.prior_weight = prior_weight
        self.grow = 1.0 / (1.0 - 1.0 / window)
        self.succ = [0.0] * positions  # recent (fading) outcomes, times ``_w``
        self.seen = [0.0] * positions
        self.observations = 0  # request-steps that verified drafts, ever
        self._w = 1.0
        self._means: list[float] | None = None

    def tick(self) -> None:
        """One request-step of the phase passed (evidence fades by ``1 - 1/window``)."""
        w = self._w = self._w * self.grow
        self._means = None
        if w > 1e100:  # rescale (the faded counts are unchanged)
            self.succ = [v / w for v in self.succ]
            self.seen = [v / w for v in self.seen]
            self._w = 1.0

    def learn_one(self, verified: int, accepted: int) -> None:
        if verified <= 0:
            return
        _count(self.succ, self.seen, self._w, verified, accepted)
        self.observations += 1
        self._means = None

    def predict_one(self) -> list[float]:
        """The posterior mean rate of each position (cached until the counts change)."""
        means = self._means
        if means is None:
            unit = self._w  # one observation, in the counts' scale
            means, before, w = [], 0.5, self.prior_weight * unit
            for s, n in zip(self.succ, self.seen):
                # the first position reverts to its recent rate with one pseudo-observation of 1/2
                # (so to 1/2 as its evidence fades), a later one to the rate of the one before it
                anchor = (s + 0.5 * unit) / (n + unit) if not means else before
                a = (s + w * anchor) / (n + w) if n + w > 0 else anchor
                a = _EPS if a < _EPS else (1.0 - _EPS if a > 1.0 - _EPS else a)
                means.append(a)
                before = a
            self._means = means
        return means

    def sample(self, rng: random.Random) -> list[float]:
        """One draw per position (normal approximation of each Beta posterior)."""
        out, w, unit, sqrt = [], self.prior_weight + 1.0, 1.0 / self._w, math.sqrt
        for a, n, z in zip(self.predict_one(), self.seen, normals(rng, self.n)):  # evidence: n * unit + prior_weight
            d = a + z * sqrt(a * (1.0 - a) / (n * unit + w))
            out.append(_EPS if d < _EPS else (1.0 - _EPS if d > 1.0 - _EPS else d))
        return out


class Persistence:
    """Lag-1 autocorrelation of consecutive first-draft outcomes, with forgetting."""

    __slots__ = ("keep", "shrink", "n", "sx", "sy", "sxy", "sxx", "_rho")

    def __init__(self, window: float = 400.0, prior_weight: float = 20.0) -> None:
        self.keep = 1.0 - 1.0 / window
        self.shrink = prior_weight
        self.n = self.sx = self.sy = self.sxy = self.sxx = 0.0
        self._rho: float | None = 0.0

    def learn_one(self, prev: float, cur: float) -> None:
        k = self.keep
        self.n = self.n * k + 1.0
        self.sx = self.sx * k + prev
        self.sy = self.sy * k + cur
        self.sxy = self.sxy * k + prev * cur
        self.sxx = self.sxx * k + prev * prev
        self._rho = None

    def predict_one(self) -> float:
        rho = self._rho
        if rho is None:
            rho = 0.0
            if self.n > 0.0:
                mx, my = self.sx / self.n, self.sy / self.n
                var = self.sxx / self.n - mx * mx
                if var > 1e-6:
                    # none unless above two standard errors of a correlation (2/sqrt(n)): chance
                    # correlation of independent outcomes counts as none (in 98 % of cases)
                    raw = (self.sxy / self.n - mx * my) / var
                    if raw > 2.0 / math.sqrt(self.n):
                        rho = min(1.0, raw) * self.n / (self.n + self.shrink)
            self._rho = rho
        return rho


class RequestRecord:
    """One request's recent outcomes in its current phase (``REQUEST_MEMORY`` steps).  ``steps``
    counts the request's steps since the counts were last rescaled; an outcome is counted with
    weight ``_GROW ** steps``, so the counts times ``_GROW ** -steps`` are the faded ones and a
    step costs one increment."""

    __slots__ = ("phase", "_succ", "_seen", "last_first", "steps")

    def __init__(self, phase: object, positions: int) -> None:
        self.phase = phase
        self._succ = [0.0] * positions
        self._seen = [0.0] * positions
        self.last_first: float | None = None
        self.steps = 0

    def age(self) -> None:
        self.steps += 1

    def _unit(self) -> float:
        """The factor from the stored counts to the faded ones (rescaling them now and then)."""
        if self.steps > 256:
            unit = _GROW ** -self.steps
            self._succ = [v * unit for v in self._succ]
            self._seen = [v * unit for v in self._seen]
            self.steps = 0
        return _GROW ** -self.steps

    @property
    def succ(self) -> list[float]:
        unit = self._unit()
        return [v * unit for v in self._succ]

    @property
    def seen(self) -> list[float]:
        unit = self._unit()
        return [v * unit for v in self._seen]

    def learn_one(self, verified: int, accepted: int) -> None:
        _count(self._succ, self._seen, 1.0 / self._unit(), verified, accepted)

    def mean_offsets(self, rates: list[float], rho: float) -> list[float]:
        """The posterior mean of this request's log-odds shifts (see ``sample_offsets``)."""
        kappa = (1.0 - rho) / rho
        return [logit((s + kappa * a) / (n + kappa)) - logit(a) for s, n, a in zip(self.succ, self.seen, rates)]

    def sample_offsets(self, rates: list[float], rho: float, rng: random.Random) -> list[float]:
        """One draw of this request's log-odds shift from its phase's ``rates``, per position.

        Its rate's posterior is ``Beta(s + kappa a, f + kappa (1 - a))``: its own successes and
        failures with ``kappa = (1 - rho) / rho`` pseudo-observations of the phase's rate ``a``
        (outcomes whose lag-1 correlation is ``rho`` behave as draws from a per-stretch rate
        spread as ``Beta(kappa a, kappa (1 - a))``, whose intra-class correlation is
        ``1 / (kappa + 1)``).  A fresh request of a phase whose outcomes persist is thus very
        uncertain, and a draw verifies its drafts often enough to learn them."""
        kappa = (1.0 - rho) / rho
        out = []
        for s, n, a in zip(self.succ, self.seen, rates):
            alpha, beta = s + kappa * a, (n - s) + kappa * (1.0 - a)
            d = rng.betavariate(alpha, beta) if alpha > 1e-9 and beta > 1e-9 else a
            out.append(logit(d) - logit(a))
        return out


def shifted(rates: list[float], offsets: list[float] | None) -> list[float]:
    if not offsets:
        return rates
    return [sigmoid(logit(a) + o) for a, o in zip(rates, offsets)]


def survival_of_logits(logits: Sequence[float]) -> list[float]:
    """``survival`` of the rates ``sigmoid(z_j)`` (``sigmoid`` written out: once per draft)."""
    out, s = [], 1.0
    exp = math.exp
    for z in logits:
        if z >= 0.0:
            s *= 1.0 / (1.0 + exp(-z))
        else:
            e = exp(z)
            s *= e / (1.0 + e)
        out.append(s)
    return out


def shifted_survival(logits: Sequence[float], shifts: Sequence[float]) -> list[float]:
    """``survival`` of the rates ``sigmoid(z_j + shift_j)``."""
    return survival_of_logits([z + d for z, d in zip(logits, shifts)])


def survival(rates: list[float]) -> list[float]:
    """``s_j = prod_{i<=j} a_i``: the tokens draft ``j`` adds, in expectation."""
    out, s = [], 1.0
    for a in rates:
        s *= a
        out.append(s)
    return out


def expected_tokens(rates: list[float], k: int) -> float:
    """``1 + sum_{j<=k} prod_{i<=j} a_i``: the tokens a step verifying ``k`` drafts yields."""
    return 1.0 + sum(survival(rates[:k]))


class GateSample:
    """A phase's last ``RESERVOIR`` gated drafts (see the module docstring): each draft's features
    (per position), priced with one calibration ``theta = (w, b_1..b_N)`` (``price``: the phase's
    current draw of its calibrator; by default ``w = 1, b = 0``, features read as log-odds) into
    log-odds ``w*f + b_j`` and survivals.  ``learn_one`` (once per gated request-step) and
    ``price`` only record; the first read after either prices the whole sample at once, position
    by position, and keeps each position's survivals in descending order until the next change
    (``gated`` reads them from the largest down, in O(``RESERVOIR``))."""

    __slots__ = ("entries", "positions", "theta", "_descending")

    def __init__(self, positions: int) -> None:
        self.entries: deque[tuple[float, ...]] = deque(maxlen=RESERVOIR)  # each draft's features
        self.positions = positions
        self.theta: list[float] = [1.0] + [0.0] * positions
        self._descending: list[list[float]] | None = None

    def price(self, theta: list[float]) -> None:
        """Price every draft with ``theta`` from now on."""
        if theta is not self.theta:
            self.theta = theta
            self._descending = None

    def learn_one(self, features: list[float]) -> tuple[float, ...]:
        """One gated draft's features; returns their log-odds, priced with ``theta``."""
        f = tuple(features[: self.positions])
        self.entries.append(f)  # the oldest leaves a full sample
        self._descending = None
        theta = self.theta
        w = theta[0]
        return tuple([w * x + b for x, b in zip(f, theta[1:])])

    def _columns(self, shifts: Sequence[float] | None = None) -> list[list[float]]:
        """Per position, the survivals of the drafts that reached it (in the sample's order),
        with ``shifts`` added to their log-odds."""
        theta, reached = self.theta, list(self.entries)
        w, exp = -theta[0], math.exp
        shortest = min(map(len, reached), default=0)
        columns: list[list[float]] = []
        surv: list[float] | None = None
        for j in range(self.positions):
            if j >= shortest:  # drafts that stopped before position j leave
                keep = [len(f) > j for f in reached]
                reached = [f for f, k in zip(reached, keep) if k]
                if surv is not None:
                    surv = [v for v, k in zip(surv, keep) if k]
            b = -theta[j + 1] - (shifts[j] if shifts else 0.0)  # e = -(log-odds): p = 1 / (1 + exp(e))
            p = [1.0 / (1.0 + exp(e if e < 700.0 else 700.0)) for e in [w * f[j] + b for f in reached]]
            surv = p if surv is None else list(map(mul, surv, p))
            columns.append(surv)
        return columns

    def _ordered(self) -> list[list[float]]:
        ordered = self._descending
        if ordered is None:
            ordered = self._descending = [sorted(c, reverse=True) for c in self._columns()]
        return ordered

    def count(self, position: int) -> int:
        return len(self._ordered()[position])

    def gated(self, position: int, price: float) -> tuple[float, float]:
        """(``E[(s - price)^+]``, ``P(s > price)``) over the position's recent survivals."""
        ordered = self._ordered()[position]
        total, above = 0.0, 0
        for s in ordered:
            if s <= price:
                break
            total += s
            above += 1
        if not above:
            return 0.0, 0.0
        n = len(ordered)
        return (total - price * above) / n, above / n

    def mean(self, position: int) -> float | None:
        """The mean survival of the recent drafts that reached ``position`` (None with fewer than
        two): unconditional, since every draft the gate saw enters, verified or not."""
        values = self._ordered()[position]
        return sum(values) / len(values) if len(values) >= 2 else None

    def survivals(self, shifts: list[float], positions: int) -> list[list[float]]:
        """Per position, the survivals of the recent drafts that reached it, with ``shifts``
        added to their log-odds."""
        return self._columns(shifts)[:positions]


def gated(values: list[float], price: float) -> tuple[float, float]:
    """(``E[(s - price)^+]``, ``P(s > price)``) over ``values``."""
    gain = share = 0.0
    for s in values:
        if s > price:
            gain += s - price
            share += 1.0
    n = len(values)
    return gain / n, share / n

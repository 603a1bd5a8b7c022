"""What an engine step costs: one model of the whole step, learned online (pure logic).

``StepCost`` predicts a decode step's time from what it carries,
``x = (1, requests, drafts verified, any draft verified, drafter ran, positions drafted per
request, positions drafted in all, drafter resumed, context, verified drafts x their context)``:
``time = speed * theta . x`` seconds.  The two context features (in ``CONTEXT_UNIT`` tokens,
``context_units``) price the KV a step reads: the step's total context, and each verified draft
at its own request's context; they are 0 where the policy does not read context.
- Bayesian linear regression: a Gaussian prior on ``theta`` (from the configured cost ratios,
  scaled to the first steps' times) and a Gaussian posterior given the steps seen, with the
  noise variance estimated from the residuals.  ``predict_one(x)`` is the posterior mean,
  ``sample(rng)`` one draw of ``theta`` (Thompson sampling: a choice is explored as often as the
  posterior says it may be the best, and never again once the posterior says it is not).
- The machine's speed: ``speed``, the running geometric mean of measured over predicted step
  time over the last ``WARMUP`` steps divided by the same over ``MEMORY`` steps (each ratio
  clipped to ``[1/CLIP, CLIP]``), follows a machine whose every cost moves together for a while
  (a shared host, frequency scaling); each step is fitted divided by the speed before it.  The
  coefficients then hold the costs at the machine's speed over the model's memory, a spell
  faster or slower than that is not read as the cost of the kind of step that ran during it,
  and decisions, which compare tokens per second, are the same at any common speed.
- Forgetting: every step multiplies the data's weight by ``1 - 1/MEMORY``, so the model follows
  a change in what the steps cost relative to each other (a direction the recent data did not
  vary goes back to the prior: its width makes the decision try it again, so a size seen once
  is not a dead spot).
- Evidence per shape: the steps of one shape count at most ``SHAPE_EVIDENCE`` steps' weight in
  the posterior (their mean and spread unchanged; a shape's contexts share that weight).  Each
  step is fitted divided by a speed estimated from the steps around it, so steps of one shape
  measured in one stretch share that estimate's error (a request slower or faster than the one
  before, while ``speed`` catches up); counted as independent, a few stretches would make the
  posterior sure of a price it has not measured, and a choice it rules out is never tried again.
  With the cap, a price only a few stretches told apart keeps the width that lets Thompson
  sampling try it again.
- Robust: a step's residual is clipped at ``CLIP`` times the running mean absolute residual
  before it is fitted (a stray slow step on a shared machine, a compilation, an allocator stall).
- A step that drafts after one that drafted nothing, where the idle drafter was skipped, also
  runs the drafter over the positions it missed: the ``resumed`` feature prices that once.

Invariants: the posterior covariance stays symmetric positive definite (prior precision plus a
weighted Gram matrix); the data's statistics are kept per step shape, its contexts as weighted
sums of their products (one dict update per step, O(1) on the scheduler's critical path) and
solved every ``SOLVE_EVERY`` steps (more often while fresh, and when a drafting depth is first
seen: see there); without
``learn`` the costs are the prior's, in units of a plain one-request decode step.
``predict_one`` and ``sample`` are at the steady speed; ``speed * predict_one(x)`` is the step's
time now.

``dspark_lab.shape_table.ShapeTable`` is the alternative the peers use (a mean time per shape,
nothing shared between shapes); ``scripts/cost_models.py`` measures both on recorded steps.
"""

from __future__ import annotations

import math
import random
from operator import mul
from typing import NamedTuple

from dspark_dynamic.core.draws import normals

# x = (1, requests, verified, any verified, drafter ran, drafted per request, drafted in all, resumed,
#      context, verified x context)
STEP, REQUEST, VERIFIED, FIRST, DRAFTER, DRAFTED, DRAFTED_ALL, RESUMED, CONTEXT, VERIFIED_CONTEXT = range(10)
NAMES = ("step", "request", "verified", "first verified", "drafter", "drafted", "drafted x requests", "resumed",
         "context", "verified x context")
N_FEATURES = len(NAMES)
CONTEXT_UNIT = 1024.0  # tokens: the unit of the context features (a unit, not tuned: the prior's
# PRIOR_SD holds per unit, so a price per 1k tokens of context is a priori as uncertain as any other)

MEMORY = 500.0  # steps of memory of the relative costs (tuned: the testbed's state moves over ~1000 steps)
CLIP = 3.0  # residuals clipped at this many mean absolute residuals (tuned)
WARMUP = 16  # an engine's first decode steps are not fitted (caches, allocator); also the memory of
# ``speed``: the steps over which the machine's speed is taken as steady (tuned: 16-32 replay the
# traced testbed steps' within-request prices closest, 100 follows a slow spell too late)
PRIOR_SD = 0.5  # prior standard deviation of every coefficient, in plain one-request steps (tuned)
SHAPE_EVIDENCE = WARMUP / 2  # the most steps' weight one step shape carries in the posterior (see
# "Evidence per shape"; tuned as a fraction of WARMUP: 4, 6, 8 and 16 tried on the simulator's
# noisy machines, 8 the best worst case)
SOLVE_EVERY = 128  # steps between solves (speed: a solve costs ~100-200 us; the posterior moves slowly)
# Besides: a solve at each power of two from WARMUP up to SOLVE_EVERY fitted steps (16, 32, 64:
# a fresh engine's posterior moves fast), and after the first step that drafts a depth no step
# before it did (what exploring that depth showed counts at once, not SOLVE_EVERY steps later)


class Shape(NamedTuple):
    requests: int
    verified: int
    drafted: int  # positions drafted per request (the drafter's depth for the step)
    resumed: bool = False  # the drafter caught up over positions it skipped while idle
    idle_drafter_runs: bool = False  # the drafter runs its forward even when it drafts nothing
    context: float = 0.0  # the step's requests' context, in ``context_units``
    verified_context: float = 0.0  # each verified draft at its request's ``context_units``, summed


_frexp, _ldexp = math.frexp, math.ldexp


def round_units(units: float) -> float:
    """``units`` (>= 0) floored to 5 significant bits (at most 6.25 % below): steps of nearly one
    context share a shape, so a growing context adds one every few percent."""
    m, e = _frexp(units)
    return _ldexp(int(m * 32.0), e - 5)


def context_units(tokens: float) -> float:
    """``tokens`` of context in ``CONTEXT_UNIT`` units, rounded (``round_units``)."""
    return round_units(tokens / CONTEXT_UNIT)


def context_units_until(tokens: int) -> tuple[float, float]:
    """``context_units(tokens)``, and the fewest tokens (>= ``tokens + 1``) at which it changes:
    every context from ``tokens`` up to (not including) that has the same units."""
    units = context_units(tokens)
    if units <= 0.0:
        return units, tokens + 1
    m, e = _frexp(units)  # units = int(32 m) 2^(e - 5) exactly: the next value is one step up
    return units, _ldexp(int(m * 32.0) + 1, e - 5) * CONTEXT_UNIT


def features(shape: Shape) -> tuple[float, ...]:
    r, v, d = float(shape.requests), float(shape.verified), float(shape.drafted)
    ran = 1.0 if d > 0 or shape.idle_drafter_runs else 0.0
    return (1.0, r, v, 1.0 if v > 0 else 0.0, ran, d, d * r, 1.0 if shape.resumed else 0.0,
            shape.context, shape.verified_context)


def prior_mean(verify: float, draft: float, draft_token: float) -> list[float]:
    """The prior's coefficients in plain one-request steps: a plain step split evenly between
    the step and its request, ``verify`` per verified draft, ``draft`` for running the drafter,
    ``draft_token`` per drafted position (0 for a parallel drafter)."""
    return [0.5, 0.5, verify, 0.0, draft, draft_token, 0.0, 0.0, 0.0, 0.0]


def _outer(x: list[float] | tuple[float, ...]) -> list[float]:
    """``x x^T``, row by row."""
    return [a * b for a in x for b in x]


def _nonzero(x: tuple[float, ...]) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """``x``'s nonzero entries ``(i, x_i)``, and the upper triangle's of ``x x^T`` as
    ``(i N + j, x_i x_j)``, ``i <= j`` (what a step of its shape adds to the Gram matrix)."""
    nz = [(i, v) for i, v in enumerate(x) if v]
    n = len(x)
    return nz, [(i * n + j, vi * vj) for i, vi in nz for j, vj in nz if j >= i]


def _cholesky(a: list[list[float]]) -> list[list[float]] | None:
    """The lower-triangular ``L`` with ``L L^T = a`` (rows of full length), None unless ``a`` is
    positive definite."""
    n = len(a)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = a[i][j] - sum(map(mul, low[i][:j], low[j][:j]))
            if i == j:
                if s <= 0.0:
                    return None
                low[i][i] = math.sqrt(s)
            else:
                low[i][j] = s / low[j][j]
    return low


def _inverse_columns(low: list[list[float]]) -> list[list[float]]:
    """The columns of ``L^-1`` for a lower-triangular ``L`` with a positive diagonal: column ``j``
    is row ``j`` of ``U = L^-T`` (upper triangular: ``U U^T = (L L^T)^-1``)."""
    n = len(low)
    cols = [[0.0] * n for _ in range(n)]
    for i in range(n):
        row = low[i]
        d = 1.0 / row[i]
        cols[i][i] = d
        for j in range(i):  # (L^-1)_ij = -(1 / L_ii) sum_{j <= k < i} L_ik (L^-1)_kj
            col = cols[j]
            col[i] = -d * sum(map(mul, row[j:i], col[j:i]))
    return cols


class StepCost:
    """``time = theta . features(shape)``, learned online (see the module docstring)."""

    def __init__(self, verify: float = 0.5, draft: float = 0.04, draft_token: float = 0.0, learn: bool = True) -> None:
        self.learn = learn
        self.relative = prior_mean(verify, draft, draft_token)
        self.scale = 1.0  # seconds per plain one-request step (set from the warm-up steps)
        self.mean = list(self.relative)  # posterior mean of theta
        self._low: list[list[float]] | None = None  # Cholesky factor of the posterior covariance
        self.solved = 0  # solves so far (0: the prior's costs)
        self.fitted = 0
        self._warm: list[tuple[float, tuple[float, ...]]] = []
        self._keep = 1.0 - 1.0 / MEMORY
        self._grow = 1.0 / self._keep
        self._w = 1.0  # weight of the next step (grows; renormalised at each solve)
        # per shape seen (its first five fields): [its features without context, ``predict_one`` of
        # them until the mean moves, sum w, sum w y, sum w y^2, ``_nonzero`` of the features, sums
        # of w (c, cv, c c, c cv, cv cv, c y, cv y) over its contexts c and verified contexts cv]
        self._entries: dict[tuple, list] = {}
        self.abs_err = 0.0
        self.noise = 0.0  # residual variance (seconds^2, at the steady speed)
        self.speed = 1.0  # the machine's speed lately over its speed in the model's memory (see above)
        self._log_lately = self._log_usually = 0.0
        self._level = 0.0  # log of how far the fit's predictions have moved since the warm-up (at solves)
        self._depths_seen: set[int] = set()  # drafting depths of the fitted steps
        self._solve_at = WARMUP  # the fitted steps at the next scheduled solve (see SOLVE_EVERY)

    @property
    def known(self) -> bool:
        """The costs come from data (or are given): decisions may leave the phase defaults."""
        return not self.learn or self.solved > 0

    def predict_one(self, x: tuple[float, ...]) -> float:
        m = self.mean
        return sum(m[i] * v for i, v in enumerate(x) if v)

    def learn_one(self, shape: Shape, seconds: float, context: float = 0.0, verified_context: float = 0.0) -> None:
        """Add one decode step (O(1): one shape's sums; a solve every ``SOLVE_EVERY`` steps).
        ``shape`` may be a plain tuple of ``Shape``'s first five fields, with the contexts given
        apart (the hot path), or a whole ``Shape``."""
        if not self.learn or seconds <= 0.0 or shape[0] <= 0:
            return
        if len(shape) > 5:
            key, context, verified_context = shape[:5], shape[5], shape[6]
        else:
            key = shape
        entry = self._entries.get(key)
        if entry is None:
            x = features(Shape(*key))
            entry = self._entries[key] = [x, None, 0.0, 0.0, 0.0, _nonzero(x), [0.0] * 7]
        if self.scale == 1.0 and self.solved == 0:
            x = entry[0]
            self._warm.append((seconds, x))
            if len(self._warm) <= WARMUP:
                return
            if len(self._warm) == WARMUP + 1:
                self._set_scale()
        pred = entry[1]
        if pred is None:  # the mean changes only at a solve
            pred = entry[1] = self.predict_one(entry[0])
        c, cv = context, verified_context
        if c or cv:  # (the cached prediction leaves them out)
            pred += self.mean[CONTEXT] * c + self.mean[VERIFIED_CONTEXT] * cv
        speed = self.speed
        if pred > 0.0:  # the machine's speed: running geometric means of clipped ratios, lately and over MEMORY
            ratio = seconds / pred
            # the machine's level: the ratio to the fit plus the fit's own level (so the fit
            # catching up with a slower machine does not read as the machine speeding up)
            log_ratio = math.log(CLIP if ratio > CLIP else (1.0 / CLIP if ratio < 1.0 / CLIP else ratio)) + self._level
            lately = self._log_lately = self._log_lately + (log_ratio - self._log_lately) / WARMUP
            usually = self._log_usually = self._log_usually + (log_ratio - self._log_usually) / MEMORY
            self.speed = math.exp(lately - usually)
        err = seconds / speed - pred
        abs_err = self.abs_err
        if abs_err > 0.0:
            bound = CLIP * abs_err
            err = -bound if err < -bound else (bound if err > bound else err)
            self.abs_err = 0.98 * abs_err + 0.02 * abs(err)
        else:
            self.abs_err = abs(err)
        y = pred + err
        w = self._w = self._w * self._grow
        entry[2] += w
        wy = w * y
        entry[3] += wy
        entry[4] += wy * y
        if c or cv:  # w times (c, cv, c c, c cv, cv cv, c y, cv y), summed
            s, wc, wv = entry[6], w * c, w * cv
            s[0] += wc
            s[1] += wv
            s[2] += wc * c
            s[3] += wc * cv
            s[4] += wv * cv
            s[5] += wc * y
            s[6] += wv * y
        fitted = self.fitted = self.fitted + 1
        if shape[2] not in self._depths_seen:
            self._depths_seen.add(shape[2])
            if self.solved:
                self.solve()
                return
        if fitted == self._solve_at:
            self.solve()

    def _set_scale(self) -> None:
        """Seconds per plain one-request step: the median of the warm-up steps' times over what
        the prior predicts for them (the prior is in units of that step)."""
        ratios = sorted(t / max(1e-9, sum(r * v for r, v in zip(self.relative, x))) for t, x in self._warm[1:])
        self.scale = ratios[len(ratios) // 2]
        self.mean = [self.scale * c for c in self.relative]
        self._forget_predictions()
        self._warm = []

    def _forget_predictions(self) -> None:
        """The mean moved: every shape's prediction is stale."""
        for entry in self._entries.values():
            entry[1] = None

    def solve(self) -> None:
        """The posterior given the forgotten statistics (and the noise variance they show)."""
        fitted = self.fitted
        if fitted >= self._solve_at:  # the next scheduled solve: doubling up to SOLVE_EVERY, then every SOLVE_EVERY
            self._solve_at = fitted * 2 if fitted < SOLVE_EVERY else (fitted // SOLVE_EVERY + 1) * SOLVE_EVERY
        n = N_FEATURES
        scale = 1.0 / self._w
        self._w = 1.0
        xx = [0.0] * (n * n)  # the weighted Gram matrix, row by row (its upper triangle, then mirrored)
        xy = [0.0] * n
        yy = weight = 0.0
        for shape, entry in list(self._entries.items()):
            w, wy, wyy = entry[2] * scale, entry[3] * scale, entry[4] * scale
            if w < 1e-9:  # forgotten: a shape seen again starts new sums
                del self._entries[shape]
                continue
            entry[2], entry[3], entry[4] = w, wy, wyy
            ctx = entry[6] = [v * scale for v in entry[6]]
            if w > SHAPE_EVIDENCE:  # the shape's mean and spread, at most SHAPE_EVIDENCE steps' weight
                shrink = SHAPE_EVIDENCE / w  # (over all its contexts together)
                w, wy, wyy, ctx = SHAPE_EVIDENCE, wy * shrink, wyy * shrink, tuple(v * shrink for v in ctx)
            weight += w
            yy += wyy
            for i, v in entry[5][0]:
                xy[i] += wy * v
                xx[i * n + CONTEXT] += v * ctx[0]  # (the context features are the last two)
                xx[i * n + VERIFIED_CONTEXT] += v * ctx[1]
            for ij, vv in entry[5][1]:
                xx[ij] += w * vv
            xx[CONTEXT * n + CONTEXT] += ctx[2]
            xx[CONTEXT * n + VERIFIED_CONTEXT] += ctx[3]
            xx[VERIFIED_CONTEXT * n + VERIFIED_CONTEXT] += ctx[4]
            xy[CONTEXT] += ctx[5]
            xy[VERIFIED_CONTEXT] += ctx[6]
        if weight <= 0.0:
            return
        # residual variance at the current mean (what the data says of the noise), floored so a
        # few identical steps do not claim certainty
        m = self.mean
        for i in range(n):  # the lower triangle from the upper
            for j in range(i):
                xx[i * n + j] = xx[j * n + i]
        sse = yy - 2.0 * sum(map(mul, m, xy)) + sum(map(mul, _outer(m), xx))
        floor = (0.01 * self.scale) ** 2
        self.noise = max(sse / weight, floor)
        prior_var = (PRIOR_SD * self.scale) ** 2
        # the precision matrix and its right-hand side in reverse order: with its Cholesky factor
        # ``L`` (``J P J = L L^T``, ``J`` the reversal), ``J L^-T J`` is the covariance's own
        # lower Cholesky factor
        diagonal = 1.0 / prior_var
        precision = [[xx[i * n + j] / self.noise + (diagonal if i == j else 0.0) for j in range(n - 1, -1, -1)]
                     for i in range(n - 1, -1, -1)]
        low = _cholesky(precision)
        if low is None:
            return
        rhs = [xy[i] / self.noise + self.scale * self.relative[i] / prior_var for i in range(n - 1, -1, -1)]
        upper = _inverse_columns(low)  # U = L^-T, row by row
        v: list[float] = []  # the mean solves P mean = rhs: forward with L, back with L^T (U's rows)
        for i in range(n):
            v.append((rhs[i] - sum(map(mul, low[i][:i], v))) * upper[i][i])
        old = self.mean
        self.mean = [sum(map(mul, upper[i][i:], v[i:])) for i in range(n - 1, -1, -1)]
        moved = total = 0.0  # the fit's level moves by its predictions' mean log change over the steps seen
        for entry in self._entries.values():
            w = entry[2]
            if w > 0.0:
                x = entry[0][:CONTEXT] + (entry[6][0] / w, entry[6][1] / w)  # at the shape's mean contexts
                before, after = sum(map(mul, old, x)), sum(map(mul, self.mean, x))
                if before > 0.0 and after > 0.0:
                    moved += w * math.log(after / before)
                    total += w
        if total > 0.0:
            self._level += moved / total
        self._forget_predictions()
        # the covariance's lower Cholesky factor, row i its first i + 1 entries: U's row N-1-i
        # read from its last entry to its diagonal
        self._low = [row[: i - 1 if i else None : -1] for i, row in enumerate(upper)][::-1]
        self.solved += 1

    def sample(self, rng: random.Random) -> list[float]:
        """One draw of ``theta`` from the posterior (the mean itself while costs are given or
        not yet solved)."""
        low = self._low
        if low is None or not self.learn:
            return self.mean
        z = normals(rng, N_FEATURES)
        # row i of the Cholesky factor: its first i+1 entries (``sum`` adds in order, from the mean)
        return [sum(map(mul, row, z), m) for m, row in zip(self.mean, low)]

    def sd(self, index: int) -> float:
        """The posterior standard deviation of one coefficient (0 while given)."""
        low = self._low
        if low is None:
            return 0.0 if not self.learn else PRIOR_SD * self.scale
        return math.sqrt(sum(v * v for v in low[index]))  # row ``index`` of L: var = (L L^T)_ii

    def describe(self) -> str:
        unit = self.scale
        terms = ", ".join(f"{name} {c / unit:.3f}" for name, c in zip(NAMES, self.mean) if abs(c) > 1e-3 * unit)
        where = "learned" if self.learn and self.solved else "given"
        return f"step cost ({where}, plain step {1e3 * unit:.2f} ms = 1): {terms}"

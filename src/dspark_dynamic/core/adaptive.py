"""Adaptive depth: one cost model of the step, one decision per step for the batch (pure logic).

The learning room: ``costs.StepCost`` (a step's time from what it carries, each verified draft
priced at its request's context: a Bayesian linear regression), ``acceptance`` (per phase, each
position's rate, the persistence of outcomes, each request's record; with draft confidences the
phase's ``confidence.ConfidenceCalibrator``), ``decide`` (``admit``: what this step verifies,
ranked by survival per unit of each draft's own verify time; ``drafting_depth``: how deep the
batch drafts next; both maximise expected tokens per expected second), ``estimate`` (the live
estimate against plain decoding and the fixed depth), and this glue.  ``contexts`` (per request, set
before a step's gate and plan) feeds the context features (``context_features=False``: none).

Each step decides under one draw of the costs, of each phase's rates and calibrator and of each
request's own record (Thompson sampling; a draw holds ``DRAW_EVERY`` steps, a request's until it
observes):
a depth is tried as often as the posteriors say it may be the best, which prices a probe at
what the whole step pays at its batch, and stops probing once the evidence is fresh.

Learn without losing: a phase drafts and verifies its default depth (``reasoning_depth`` /
``answer_depth``) until the cost model has been solved once and the phase has its own evidence
(``prior_weight`` observed request-steps; with confidences, ``MIN_LABELS`` calibration labels).

Survival of a request's draft ``j`` (the tokens it adds in expectation): with confidences, the
running product of its calibrated probabilities; without, the running product of the phase's
drawn rates.  Either is shifted in log-odds by the request's own recent record where outcomes
persist (``acceptance.RequestRecord``).  The drafting decision prices a position at its gated
gain: the phase's recent survivals at that position (``GateSample``) with confidences, the
drawn survival without.

Tuned constants (8, each documented where defined): ``costs.MEMORY``, ``CLIP``, ``WARMUP``,
``SHAPE_EVIDENCE``, ``PRIOR_SD``, ``acceptance.REQUEST_MEMORY``, ``MIN_LABELS`` (here) and
``confidence.CALIBRATOR_MEMORY``.  Settings of host time (each bounds the controller's cost per
step; none is tuned to a testbed): ``DRAW_EVERY`` (here), ``costs.SOLVE_EVERY`` and
``acceptance.RESERVOIR`` (a sample size: the decisions measure the same from 16 to 64).
"""

from __future__ import annotations

import random
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

from dspark_dynamic.core.acceptance import (GateSample, Persistence, PositionRates, RequestRecord, logit, shifted,
                                             shifted_survival, sigmoid, survival)
from dspark_dynamic.core.confidence import ConfidenceCalibrator
from dspark_dynamic.core.costs import (CONTEXT, DRAFTED, DRAFTED_ALL, DRAFTER, FIRST, REQUEST, RESUMED, STEP, VERIFIED,
                                       VERIFIED_CONTEXT, StepCost, round_units)
from dspark_dynamic.core.decide import admit, drafting_depth, gated_gains
from dspark_dynamic.core.estimate import LiveEstimate, fixed_yield
from dspark_dynamic.core.phase import Phase

# Labels before a phase's calibrator leaves its prior's guess (until then the phase verifies and
# drafts its default; tuned: on the testbed a fresh calibrator verified nothing and never learned)
MIN_LABELS = 16
# Steps a draw holds (costs, phase rates; a request's own until it observes): host time (a draw
# and the decisions it renews cost ~25 us at one request, the rest of a step ~20 us); 8 lost
# without confidences on the simulator's noisy machines (worst machine 0.991 -> 0.942)
DRAW_EVERY = 4
_FRESH = object()  # in a gate's key: a request's survivals are fresh each step, so not kept
_REASONING = Phase.REASONING  # (an enum member read from its class costs ~0.1 us a step)
_REQUEST = itemgetter(1)  # a plan row's or gate item's request id (C-level: the contexts are read per step)


class _PhaseDraw(NamedTuple):
    """One step's draw of a phase's rates, and what the decisions read of it."""

    mean: list[float]  # the posterior mean rates
    drawn: list[float]  # the drawn rates
    drawn_survival: list[float]
    moved: list[float]  # drawn survival less the mean's, per position (empty unless gating)
    shifts: list[float]  # drawn rates less the mean's, in log-odds (empty unless gating or rho > 0)
    rho: float  # the phase's persistence (as of the draw)


class AdaptivePolicy:
    """Per-step depths for the batch from the learned step cost and acceptance (see above)."""

    def __init__(self, num_speculative_tokens: int, default_depths: dict[Phase, int], min_depth: int = 0,
                 verify_cost_ratio: float = 0.5, draft_cost_ratio: float = 0.04, draft_token_cost_ratio: float = 0.0,
                 learn_cost: bool = True, prior_weight: float = 20.0, window: float = 400.0, confidence: bool = True,
                 seed: int = 0, drafter_catches_up: bool = False, idle_drafter_runs: bool = False,
                 context_features: bool = True) -> None:
        self.n = num_speculative_tokens
        self.min_depth = min(min_depth, self.n)
        self.defaults = {p: min(max(k, self.min_depth), self.n) for p, k in default_depths.items()}
        self.prior_weight = prior_weight
        self.drafter_catches_up = drafter_catches_up  # the idle drafter is skipped, and catches up on resuming
        self.idle_drafter_runs = idle_drafter_runs  # the drafter runs even at depth 0 (nothing to save there)
        self.cost = StepCost(verify_cost_ratio, draft_cost_ratio, draft_token_cost_ratio, learn_cost)
        self.rates = {p: PositionRates(self.n, prior_weight, window) for p in Phase}
        self.persistence = {p: Persistence(window, prior_weight) for p in Phase}
        self.records: dict[str, RequestRecord] = {}
        self.calibrators = {p: ConfidenceCalibrator(self.n) for p in Phase} if confidence else None
        self.reads_confidences = confidence
        self.confidence_seen = False  # drafts came with confidences (only where there are calibrators): gate on them
        self.min_labels = MIN_LABELS
        self.gated = {p: GateSample(self.n) for p in Phase}
        self.offsets: dict[str, list[float] | None] = {}  # per request: the offsets of its last gate
        self.speed = LiveEstimate(self.n, DRAW_EVERY, seed + 1)  # (``account_step``)
        # per request, its ``costs.context_units``, kept by the caller for each gate and plan (None: none read)
        self.contexts: dict[str, float] | None = {} if context_features else None
        self._rng = random.Random(seed)
        self._theta = self.cost.mean
        self._draws: dict[Phase, _PhaseDraw] = {}  # the current draw of each phase's rates
        # ... and of each request's where its phase's outcomes persist (``_shifts``)
        self._request_draws: dict[str | None, tuple[Phase, list[float], bool, int]] = {}
        self._ready: set[Phase] = set()  # the phases ``ready`` said true of
        self._steps = DRAW_EVERY  # steps since the last draw (the first step draws)
        self._serial = 0  # request draws so far (names a draw in ``_plan_key``)
        self._solved = -1  # the cost model's solves at the last draw
        # decided under the current draw: drafting depths (by ``_plan_key``) with what drafting them
        # costs the step, and verified depths (by what they depend on, ``gate``)
        self._plans: dict[tuple, tuple[int, float]] = {}
        self._gates: dict[tuple, list[int]] = {}
        self._step_terms: dict = {}  # ``_terms`` by batch (negative: resuming), ``_priced`` by contexts, this draw
        self._yields: dict[Phase, float] = {}  # ``estimate.fixed_yield`` per phase, this draw
        self._last_drafted = -1  # the drafter's depth in the previous step (-1: none seen)
        self._drafting_now = 0.0  # what the drafting planned for this step costs it

    # -- the step's draws ---------------------------------------------------------------

    def begin_step(self) -> None:
        """Draw the costs (lazily: each phase's rates, each request's own) every ``DRAW_EVERY``
        steps; a draw holds that long (a request's until it observes), so the gate verifies what
        the plan drafted for."""
        self._steps += 1
        if self._steps >= DRAW_EVERY or self._solved != self.cost.solved:  # held, until a new posterior
            self._steps = 0
            self._solved = self.cost.solved
            self._theta = self.cost.sample(self._rng)
            for kept in (self._draws, self._plans, self._gates, self._step_terms, self._request_draws, self._yields):
                kept.clear()

    def _draw(self, phase: Phase) -> _PhaseDraw:
        """The current draw of the phase's rates (once per phase and draw period)."""
        draw = self._draws.get(phase)
        if draw is None:
            rates = self.rates[phase]
            mean = rates.predict_one()
            drawn = rates.sample(self._rng)
            drawn_survival, rho, gating = survival(drawn), self.persistence[phase].predict_one(), self.confidence_seen
            if gating:  # the gate and the drafting decision price drafts with it
                self.gated[phase].price(self.calibrators[phase].sample(self._rng))
            draw = self._draws[phase] = _PhaseDraw(  # what only gating or a request's own draw reads, only then
                mean, drawn, drawn_survival, [d - m for d, m in zip(drawn_survival, survival(mean))] if gating else [],
                [logit(d) - logit(m) for d, m in zip(drawn, mean)] if gating or rho > 0.0 else [], rho)
        return draw

    def ready(self, phase: Phase) -> bool:
        """The phase may leave its default: costs solved, and evidence of its own (kept once true:
        solves, labels and observations only grow; forgotten when gating starts)."""
        if phase not in self._ready:
            if not self.cost.known or not (self.calibrators[phase].report.labels >= self.min_labels if self.confidence_seen
                                            else self.rates[phase].observations >= self.prior_weight):
                return False
            self._ready.add(phase)
        return True

    def _terms(self, requests: int) -> tuple[tuple[float, float, float], list[float]]:
        """This draw's (base, verify, first) for ``requests``: seconds without verifying, per verified
        draft, once for any; and what drafting ``D = 0..N`` positions adds (kept for the draw)."""
        resuming = self.drafter_catches_up and self._last_drafted == 0
        key = -requests if resuming else requests
        terms = self._step_terms.get(key)
        if terms is None:
            t = self._theta
            base = t[STEP] + t[REQUEST] * requests
            floor = 0.05 * self.cost.scale * requests
            once = (0.0 if self.idle_drafter_runs else t[DRAFTER]) + (t[RESUMED] if resuming else 0.0)
            per = t[DRAFTED] + t[DRAFTED_ALL] * requests
            terms = self._step_terms[key] = (  # the floor: a step is never nearly free
                ((base if base > floor else floor), max(t[VERIFIED], 0.0), max(t[FIRST], 0.0)),
                [0.0] + [max(0.0, once + per * d) for d in range(1, self.n + 1)])
        return terms

    # -- DepthPolicy --------------------------------------------------------------------

    def depth(self, phase: Phase, request_id: str | None = None) -> int:
        return self.plan([(phase, request_id)])[0]

    def plan(self, rows: list[tuple[Phase, str | None]]) -> list[int]:
        """Next-step drafting depths for the requests drafting in this step (one depth for all:
        the drafter drafts for the whole batch)."""
        records, rates, ready, fresh = self.records, self.rates, self._ready, False
        for phase, req in rows:
            rates[phase].tick()
            record = records.get(req)
            if record is not None and record.phase is phase:
                record.steps += 1
            elif req is not None:
                records[req] = RequestRecord(phase, self.n)
            if not fresh and phase not in ready and not self.ready(phase):
                fresh = True
        if not rows:
            return []
        requests = len(rows)
        if fresh:  # learn without losing: every request's default positions are drafted
            depth = max(self.defaults[p] for p, _ in rows)
            kept = (depth, self._terms(requests)[1][depth])
        else:
            units = tuple(map(self.contexts.get, map(_REQUEST, rows), repeat(0.0))) if self.contexts else None
            key = (self._plan_key(rows), units) if units else self._plan_key(rows)  # (contexts by row)
            if (kept := self._plans.get(key)) is None:
                (base, verify, first), drafting = self._terms(requests)
                base, verify = self._priced(base, verify, units)
                depth = drafting_depth(requests, base, first, drafting, self._gains_for(rows, verify), self.min_depth)
                kept = self._plans[key] = (depth, drafting[depth])
        self._drafting_now = kept[1]
        return [kept[0]] * requests

    def _priced(self, base: float, verify: float, units: tuple[float, ...] | None) -> tuple[float, float | list[float]]:
        """This draw's base and per-request verify times at ``units`` of context (totals floored, not
        terms; kept for the draw)."""
        if not units:
            return base, verify
        if (kept := self._step_terms.get(units)) is None:
            t, floor = self._theta, 0.05 * self.cost.scale * len(units)
            base = max(t[STEP] + t[REQUEST] * len(units) + t[CONTEXT] * sum(units), floor)
            kept = self._step_terms[units] = (base, [max(t[VERIFIED] + t[VERIFIED_CONTEXT] * u, 0.0) for u in units])
        return kept

    def _plan_key(self, rows: list[tuple[Phase, str | None]]) -> tuple:
        """What a batch's drafting decision depends on under the current draws: how many requests
        are their phase's, the own draws of the others, whether the drafter resumes."""
        reasoning = answer = 0
        own = []
        for phase, req in rows:
            if self._draw(phase).rho > 0.0 and self._shifts(phase, req)[1]:
                own.append(self._request_draws[req][3])
            elif phase is _REASONING:
                reasoning += 1
            else:
                answer += 1
        return answer, reasoning, self.drafter_catches_up and self._last_drafted == 0, *own

    def _gains_for(self, rows: list[tuple[Phase, str | None]], verify: float | list[float]):
        """``gains_at(rate)`` of ``decide.drafting_depth`` for these requests: per request and
        position, its phase's recent gated drafts under the request's drawn shifts (with
        confidences), else its drawn survival, as if sure or hopeless; each priced at its verify
        time (``verify``: one for all, or one per row)."""
        n = self.n
        per_row = []  # (multiplicity, drawn survival, price moves, gated sample, recent survivals, verify)
        by_phase: dict[tuple[Phase, float], list] = {}  # requests of one phase and price share one row
        gating = self.confidence_seen
        for i, (phase, req) in enumerate(rows):
            v = verify if isinstance(verify, float) else verify[i]
            shifts, own = self._shifts(phase, req)
            if not own:  # the phase's draw: its gated drafts, the price moved by the draw
                row = by_phase.get((phase, v))
                if row is None:
                    draw = self._draw(phase)
                    row = by_phase[phase, v] = [0, draw.drawn_survival, draw.moved,
                                                self.gated[phase] if gating else None, None, v]
                    per_row.append(row)
                row[0] += 1
                continue
            drawn = survival([sigmoid(logit(a) + d) for a, d in zip(self._draw(phase).mean, shifts)])
            recent = self.gated[phase].survivals(shifts, n) if gating else None
            per_row.append([1, drawn, None, None, recent, v])  # the request's shifts on each gated draft
        return lambda rate: gated_gains(per_row, n, rate)

    def _shifts(self, phase: Phase, req: str | None) -> tuple[list[float], bool]:
        """The current draw of the request's acceptance, as log-odds shifts from its phase's mean
        rates: the phase's drawn rates, and, where the phase's outcomes persist, the request's
        own record drawn around them (``RequestRecord.sample_offsets``; then True).  Where the
        draw's ``rho`` is 0 this is ``(draw.shifts, False)``: the gate and the plan key read that
        without the call, on every step."""
        draw = self._draw(phase)
        rho = draw.rho
        if rho <= 0.0 or req is None:  # the phase's draw: nothing of the request's own to hold
            return draw.shifts, False
        cached = self._request_draws.get(req)
        if cached is not None and cached[0] is phase:
            return cached[1], cached[2]
        record = self.records.get(req)
        if record is None or record.phase is not phase:
            shifts, own = draw.shifts, False
        else:
            shifts = [a + b for a, b in zip(draw.shifts, record.sample_offsets(draw.drawn, rho, self._rng))]
            own = True
        self._serial += 1
        self._request_draws[req] = (phase, shifts, own, self._serial)
        return shifts, own

    def gate(self, items: list[tuple[Phase, str, list[float] | None, int]], uniform: str | None = None) -> list[int]:
        """This step's verified depths: ``items`` are (phase, request id, the drafter's features
        of its drafts or None, drafts available); returns one depth per item."""
        survivals = []
        calibrators = self.calibrators
        if calibrators is not None and not self.confidence_seen and any(f is not None for _p, _r, f, _a in items):
            self.confidence_seen = True
            self._ready.clear()  # readiness now asks for calibration labels
            for kept in (self._draws, self._request_draws, self._plans, self._gates, self._yields):  # drawn and
                kept.clear()  # decided again with the calibrators
        # the depths depend on these alone where every request reads its phase's draw (then kept for the draw)
        key: list = [uniform, self._drafting_now, self.drafter_catches_up and self._last_drafted == 0]
        for phase, req, features, available in items:
            if phase not in self._ready and not self.ready(phase):
                survivals.append([1.0] * min(self.defaults[phase], available))  # the default's drafts count as sure
                self.offsets[req] = None
                key.append((phase, available, -1))
                continue
            draw = self._draw(phase)  # (with confidences, it prices the phase's gated drafts)
            shifts, own = self._shifts(phase, req) if draw.rho > 0.0 else (draw.shifts, False)
            if features is not None and calibrators is not None:
                z = self.gated[phase].learn_one(features[:available])
                # the calibrator learns against the request's expected shift (not this step's draw)
                self.offsets[req] = (self.records[req].mean_offsets(self.rates[phase].predict_one(), draw.rho)
                                     if own else None)
                survivals.append(shifted_survival(z, shifts))
                key.append(_FRESH)
            elif own:  # around the phase's current rates: not kept either
                survivals.append(survival(shifted(self.rates[phase].predict_one(), shifts))[:available])
                key.append(_FRESH)
            else:
                survivals.append(draw.drawn_survival[:available])
                key.append((phase, available, 0))
        units = tuple(map(self.contexts.get, map(_REQUEST, items), repeat(0.0))) if self.contexts else None
        key.append(units)
        kept = self._gates.get(key := tuple(key))
        if kept is not None:
            return kept
        base, verify, first = self._terms(len(items))[0]
        base, verify = self._priced(base, verify, units)
        depths = admit(survivals, base + self._drafting_now, verify, first, uniform)
        if self.min_depth:
            depths = [max(k, min(self.min_depth, available)) for k, (_p, _r, _f, available) in zip(depths, items)]
        if _FRESH not in key:
            self._gates[key] = depths
        return depths

    # -- learning -----------------------------------------------------------------------

    def observe(self, phase: Phase, verified: int, accepted: int, request_id: str | None = None) -> None:
        if verified <= 0:
            return
        self.rates[phase].learn_one(verified, accepted)
        if request_id is None:
            return
        record = self.records.get(request_id)
        if record is None or record.phase is not phase:
            record = self.records[request_id] = RequestRecord(phase, self.n)
        record.learn_one(verified, accepted)
        self._request_draws.pop(request_id, None)  # drawn again with what it just showed
        first = 1.0 if accepted > 0 else 0.0
        if record.last_first is not None:
            self.persistence[phase].learn_one(record.last_first, first)
        record.last_first = first

    def observe_confidence(self, phase: Phase, features: list[float], verified: int, accepted: int,
                           request_id: str | None = None) -> None:
        offsets = self.offsets.pop(request_id, None) if request_id is not None else None
        self.calibrators[phase].observe(features, verified, accepted, offsets)

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int,
                     context: float = 0.0, verified_context: float = 0.0) -> None:
        """``context``, ``verified_context``: the step's, and its verified drafts x theirs (``context_units``)."""
        drafted = max(draft_depth, 0)
        resumed = self.drafter_catches_up and drafted > 0 and self._last_drafted == 0
        if self.contexts is None:
            context = verified_context = 0.0
        self.cost.learn_one((num_requests, verified_tokens, drafted, resumed, self.idle_drafter_runs), seconds,
                            context, verified_context)
        self._last_drafted = drafted

    def account_step(self, seconds: float, decisions: dict[str, tuple[Phase, int]], tokens: dict[str, int]) -> None:
        """A decode step for ``estimate`` (kept at random, one in ``DRAW_EVERY``: ``LiveEstimate``)."""
        if self.speed.due() and self.cost.known and self.cost.learn:
            ctx = round_units(sum(map(self.contexts.get, decisions, repeat(0.0)))) if self.contexts else 0.0
            self.speed.learn_step(self.cost, seconds, decisions, tokens, self._fixed_yield, self.idle_drafter_runs, ctx)

    def _fixed_yield(self, phase: Phase) -> float:
        """What one request-step of ``phase`` at the fixed depth yields (kept for the draw)."""
        y = self._yields.get(phase)
        if y is None:
            y = self._yields[phase] = fixed_yield(self.rates[phase].predict_one(), self.n,
                                                  self.gated[phase] if self.confidence_seen else None)
        return y

    def estimate(self) -> dict[str, dict[str, float]] | None:
        """The estimated speed-up against plain decoding and the fixed configured depth, per
        phase and overall (``estimate.SpeedEstimate``); None until the step cost is learned."""
        return self.speed.predict_one()

    def forget(self, request_id: str) -> None:
        self.records.pop(request_id, None)
        self._request_draws.pop(request_id, None)
        self.offsets.pop(request_id, None)

    def describe(self, phase: Phase) -> str:
        rates = ", ".join(f"{a:.2f}" for a in self.rates[phase].predict_one())
        line = (f"adaptive: accept/pos=[{rates}] persistence={self.persistence[phase].predict_one():.2f} "
                f"observations={self.rates[phase].observations}; {self.cost.describe()}")
        estimate = (self.estimate() or {}).get(phase.label)
        if estimate:
            line += (f"; estimated speed-up {estimate['plain']:.2f}x plain, {estimate['fixed']:.2f}x fixed "
                     f"k={self.n}")
        if self.calibrators is not None and self.confidence_seen:
            line += f"; {self.calibrators[phase].describe()}"
        return line

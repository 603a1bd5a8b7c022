"""The live estimate under any policy: ``Estimated`` wraps a depth policy that has no estimate of
its own (the phase policy, the peers' rules) and adds ``estimate.LiveEstimate`` (pure logic).

The wrapper learns what the estimate reads beside the wrapped policy, from what the controller
hands every policy: a ``costs.StepCost`` (``observe_step``: each decode step's time and shape,
without context features: the controller hands none to a policy without ``contexts``), the
acceptance ``PositionRates`` of each phase (``observe``), and the estimate itself
(``account_step``: the decode steps, one in ``ACCOUNT_EVERY`` on average, at random gaps).  A
request-step at the fixed depth yields ``estimate.fixed_yield`` at its phase's posterior mean
rates (no confidences).

Invariants:
- The wrapped policy decides every depth: ``depth``, and ``plan``, ``gate``, ``begin_step``,
  ``observe_confidence``, ``reads_confidences`` exactly where it has them (the controller finds
  them by ``getattr``), so a per-request policy stays one and a batch policy keeps its gate;
  given the same calls, the wrapper's depths are the wrapped policy's.
- The estimate counts the requests the wrapped policy decided for (``depth``, ``plan``, ``gate``).
  The controller never hands a request with its own policy (``vllm_xargs``) to them, so such a
  request is left out of the estimate (a step it shares counts the others at their share); its
  acceptance and its steps' times still teach the rates and the costs, which price the
  alternatives: measured steps at other depths make the prices measured ones.
- ``estimate()`` is None until the step cost is solved once, and always without ``learn_cost``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dspark_dynamic.core.acceptance import PositionRates
from dspark_dynamic.core.costs import StepCost
from dspark_dynamic.core.estimate import LiveEstimate, fixed_yield
from dspark_dynamic.core.phase import Phase
from dspark_dynamic.core.policy import DepthPolicy

# Decode steps per accounted step, on average: host time (the adaptive policy samples its
# estimate as often, at its DRAW_EVERY)
ACCOUNT_EVERY = 4
# What the wrapper passes through from the wrapped policy, where it has them (no wrapping needed)
PASSED = ("begin_step", "observe_confidence", "reads_confidences")


class Estimated:
    """``inner``'s depths, with the live estimate of what they are worth (see above)."""

    def __init__(self, inner: DepthPolicy, num_speculative_tokens: int, verify_cost_ratio: float = 0.5,
                 draft_cost_ratio: float = 0.04, draft_token_cost_ratio: float = 0.0, learn_cost: bool = True,
                 prior_weight: float = 20.0, window: float = 400.0, seed: int = 0,
                 drafter_catches_up: bool = False, idle_drafter_runs: bool = False) -> None:
        self.inner = inner
        self.n = num_speculative_tokens
        self.drafter_catches_up = drafter_catches_up  # the idle drafter is skipped, and catches up on resuming
        self.idle_drafter_runs = idle_drafter_runs  # the drafter runs even at depth 0
        self.cost = StepCost(verify_cost_ratio, draft_cost_ratio, draft_token_cost_ratio, learn_cost)
        self.rates = {p: PositionRates(self.n, prior_weight, window) for p in Phase}
        self.speed = LiveEstimate(self.n, ACCOUNT_EVERY, seed + 1)
        self.decided: set[str | None] = set()  # the live requests the wrapped policy decided for
        self._last_drafted = -1  # the drafter's depth in the previous decode step (-1: none seen)
        self._depth = inner.depth
        for name in PASSED:
            if hasattr(inner, name):
                setattr(self, name, getattr(inner, name))
        plan = getattr(inner, "plan", None)
        if plan is not None:
            self.plan = _recording_plan(plan, self.decided)
        gate = getattr(inner, "gate", None)
        if gate is not None:
            self.gate = _recording_gate(gate, self.decided)

    # -- the wrapped policy's decisions ----------------------------------------------------

    def depth(self, phase: Phase, request_id: str | None = None) -> int:
        self.decided.add(request_id)
        return self._depth(phase, request_id)

    @property
    def calibrators(self) -> Any:
        """The wrapped policy's draft-confidence calibrators (metrics read them), if any."""
        return getattr(self.inner, "calibrators", None)

    @property
    def confidence_seen(self) -> bool:
        return bool(getattr(self.inner, "confidence_seen", False))

    # -- learning -------------------------------------------------------------------------

    def observe(self, phase: Phase, verified: int, accepted: int, request_id: str | None = None) -> None:
        self.inner.observe(phase, verified, accepted, request_id)
        rates = self.rates[phase]
        rates.tick()  # one request-step of the phase
        if verified > 0:
            rates.learn_one(verified, accepted)

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int,
                     context: float = 0.0, verified_context: float = 0.0) -> None:
        self.inner.observe_step(seconds, verified_tokens, num_requests, draft_depth, context, verified_context)
        drafted = draft_depth if draft_depth > 0 else 0
        resumed = self.drafter_catches_up and drafted > 0 and self._last_drafted == 0
        self.cost.learn_one((num_requests, verified_tokens, drafted, resumed, self.idle_drafter_runs), seconds)
        self._last_drafted = drafted

    def account_step(self, seconds: float, decisions: Mapping[str, tuple[Phase, int]],
                     tokens: Mapping[str, int]) -> None:
        """A decode step for ``estimate`` (kept at random, one in ``ACCOUNT_EVERY``)."""
        if self.speed.due() and self.cost.known and self.cost.learn:
            self.speed.learn_step(self.cost, seconds, decisions, tokens, self._fixed_yield, self.idle_drafter_runs,
                                  counted=self.decided)

    def _fixed_yield(self, phase: Phase) -> float:
        """What one request-step of ``phase`` at the fixed depth yields, at the phase's rates."""
        return fixed_yield(self.rates[phase].predict_one(), self.n)

    def estimate(self) -> dict[str, dict[str, float]] | None:
        """The estimated speed-up against plain decoding and the fixed configured depth, per
        phase and overall (``estimate.SpeedEstimate``); None until the step cost is learned."""
        return self.speed.predict_one()

    def forget(self, request_id: str) -> None:
        self.inner.forget(request_id)
        self.decided.discard(request_id)

    def describe(self, phase: Phase) -> str:
        describe = getattr(self.inner, "describe", None)
        line = describe(phase) if describe is not None else ""
        estimate = (self.estimate() or {}).get(phase.label)
        if estimate:
            line += (f"; estimated speed-up {estimate['plain']:.2f}x plain, {estimate['fixed']:.2f}x fixed "
                     f"k={self.n}")
        return line


def _recording_plan(plan: Callable[[list[tuple[Phase, str | None]]], list[int]],
                    decided: set[str | None]) -> Callable[[list[tuple[Phase, str | None]]], list[int]]:
    """``plan``, noting each row's request in ``decided``."""
    def recorded(rows: list[tuple[Phase, str | None]]) -> list[int]:
        decided.update([row[1] for row in rows])
        return plan(rows)

    return recorded


def _recording_gate(gate: Callable[..., list[int]], decided: set[str | None]) -> Callable[..., list[int]]:
    """``gate``, noting each item's request in ``decided``."""
    def recorded(items: list[tuple[Phase, str, Any, int]], uniform: str | None = None) -> list[int]:
        decided.update([item[1] for item in items])
        return gate(items, uniform)

    return recorded

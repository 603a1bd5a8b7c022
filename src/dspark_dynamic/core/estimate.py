"""What the plugin is worth, live: the estimated speed-up against plain decoding and against
the fixed configured depth, per phase and overall (pure logic).

Per decode step, each request's share of the step's time (``seconds / requests``) and the tokens
it added are kept per phase (for every request of the step, or for those ``counted``), with
forgetting (``1 - 1/MEMORY`` per step, as a growing weight on the new step: only the phases in
the step are touched).  Beside them, the same steps priced by the learned step cost
(``costs.StepCost``):
- *plain*: the step with no draft verified and the drafter not run, one token per request;
- *fixed*: the step with every request verifying ``N`` drafts and the drafter drafting ``N``,
  ``E_N = 1 + sum_{j<=N} prod_{i<=j} a_i`` tokens per request at the phase's acceptance rates.
The estimate is ``(tokens / seconds) / (tokens' / seconds')`` for each alternative.

Invariants: nothing is estimated until the step cost is learned (``None``); the alternatives are
priced by the same engine's fitted costs, so "plain" is this engine at depth 0 (what vLLM's
speculative path costs there over a plain engine is not in it: 1-4 % on the CPU testbed), and
the fixed depth's acceptance beyond the depths the policy verifies is the rates' extrapolation.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Container, Mapping

from dspark_dynamic.core.acceptance import GateSample
from dspark_dynamic.core.costs import MEMORY, Shape, StepCost, features
from dspark_dynamic.core.phase import Phase

ALTERNATIVES = ("plain", "fixed")


def fixed_yield(rates: list[float], depth: int, gated: GateSample | None = None) -> float:
    """Tokens per request-step at a fixed ``depth``: ``1 + sum_j s_j``, with ``s_j`` the mean
    survival at position ``j`` of the drafts the gate saw (``gated``: all of them, verified or
    not, where the rates learn only from the verified ones, which the gate picked), beyond them
    (or without a gate) the running product of the ``rates``."""
    total, s = 1.0, 1.0
    for j in range(depth):
        mean = gated.mean(j) if gated is not None else None
        s = mean if mean is not None else s * rates[j]
        total += s
    return total


class SpeedEstimate:
    """Forgetting sums per phase of (seconds, tokens) as run and as each alternative would."""

    def __init__(self, depth: int) -> None:
        self.depth = depth  # the fixed configured depth (num_speculative_tokens)
        self.grow = 1.0 / (1.0 - 1.0 / MEMORY)
        self._w = 1.0  # the current step's weight (grows per step; the sums are renormalised)
        # phase -> [seconds, tokens, plain seconds, plain tokens, fixed seconds, fixed tokens],
        # each weighted by its step's ``_w``: times ``1 / _w`` they are the forgetting sums
        self.sums = {p: [0.0] * 6 for p in Phase}
        self._prices: dict[tuple[int, float], tuple[float, float]] = {}  # (requests, context) -> (plain, fixed) seconds
        self._solved = -1

    def learn_step(self, cost: StepCost, seconds: float, decisions: Mapping[str, tuple[Phase, int]],
                   tokens: Mapping[str, int], fixed_tokens: Callable[[Phase], float],
                   idle_drafter_runs: bool = False, context: float = 0.0,
                   counted: Container[str] | None = None) -> None:
        """One decode step from the controller's view of it: each request's phase (``decisions``)
        and the tokens it added (``tokens``: the requests live at the step's output);
        ``fixed_tokens(phase)``: what a request-step at the fixed depth yields there;
        ``counted``: the requests estimated (None: every one), each at its share of the step."""
        requests: dict[Phase, int] = {}
        added: dict[Phase, int] = {}
        batch = 0
        for req_id, (phase, _k) in decisions.items():
            n = tokens.get(req_id)
            if n is not None:
                batch += 1
                if counted is None or req_id in counted:
                    requests[phase] = requests.get(phase, 0) + 1
                    added[phase] = added.get(phase, 0) + n
        if requests:
            yields = {p: fixed_tokens(p) for p in requests}
            self.learn_one(cost, seconds, requests, added, yields, idle_drafter_runs, context, batch)

    def learn_one(self, cost: StepCost, seconds: float, requests: dict[Phase, int], tokens: dict[Phase, int],
                  fixed_tokens: dict[Phase, float], idle_drafter_runs: bool = False, context: float = 0.0,
                  batch: int = 0) -> None:
        """One decode step: ``requests`` and ``tokens`` per phase; ``fixed_tokens``: per phase,
        what one request-step at the fixed depth yields at the phase's rates; ``context``: the
        step's context in ``costs.context_units`` (plain and fixed steps read it too); ``batch``:
        the step's requests, where more than those in ``requests`` (the alternatives are priced
        at the whole batch, each request estimated at ``1 / batch`` of a step)."""
        if not cost.known or not cost.learn:
            return
        r = sum(requests.values())
        if r <= 0:
            return
        if batch > r:
            r = batch
        if cost.solved != self._solved:
            self._prices.clear()
            self._solved = cost.solved
        prices = self._prices.get((r, context))
        if prices is None:
            plain = cost.predict_one(features(Shape(r, 0, 0, idle_drafter_runs=idle_drafter_runs, context=context)))
            fixed = cost.predict_one(features(Shape(r, r * self.depth, self.depth, context=context,
                                                    verified_context=self.depth * context)))
            prices = self._prices[(r, context)] = (plain, fixed)
        steady = seconds / cost.speed  # the step's time at the speed the prices are in
        w = self._w = self._w * self.grow
        if w > 1e12:  # renormalise (the ratios are unchanged)
            for acc in self.sums.values():
                acc[:] = [v / w for v in acc]
            w = self._w = 1.0
        per = w / r
        for phase, n in requests.items():
            acc = self.sums[phase]
            share = per * n
            acc[0] += steady * share
            acc[1] += w * tokens.get(phase, 0)
            acc[2] += prices[0] * share
            acc[3] += w * n
            acc[4] += prices[1] * share
            acc[5] += w * n * fixed_tokens.get(phase, 1.0)

    def predict_one(self) -> dict[str, dict[str, float]] | None:
        """``{"reasoning" | "answer" | "all": {"plain": x, "fixed": y}}``: the speed-up of what
        ran over each alternative (phases with no steps left out); None before any estimate."""
        out: dict[str, dict[str, float]] = {}
        total = [0.0] * 6
        for phase, acc in self.sums.items():
            for i, v in enumerate(acc):
                total[i] += v
            ratios = _ratios(acc)
            if ratios:
                out[phase.label] = ratios
        ratios = _ratios(total)
        if not ratios:
            return None
        out["all"] = ratios
        return out


def _ratios(acc: list[float]) -> dict[str, float] | None:
    seconds, tokens, plain_s, plain_t, fixed_s, fixed_t = acc
    if seconds <= 0.0 or tokens <= 0.0 or plain_s <= 0.0 or fixed_s <= 0.0 or plain_t <= 0.0:
        return None
    rate = tokens / seconds
    return {"plain": rate / (plain_t / plain_s), "fixed": rate / (fixed_t / fixed_s)}


class LiveEstimate(SpeedEstimate):
    """A ``SpeedEstimate`` fed one decode step in ``every`` on average, at random gaps of 1 to
    ``2 every - 1`` steps (``due``): a sample of the steps is as good an estimate at a fraction of
    the host time, and random gaps cannot alias with a pattern of the steps."""

    def __init__(self, depth: int, every: int, seed: int) -> None:
        super().__init__(depth)
        self._every = every
        self._sampler = random.Random(seed)
        self._in = 1  # steps until the next kept one

    def due(self) -> bool:
        """This step is kept (called once per step)."""
        self._in -= 1
        if self._in > 0:
            return False
        self._in = 1 + int(self._sampler.random() * (2 * self._every - 1))
        return True

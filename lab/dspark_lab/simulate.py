"""Offline replay of acceptance traces under a step-cost model (pure logic).

A trace (``workloads``: synthetic, from a file or from the controller's trace) is a list of
requests, each a list of token positions ``(phase, L, rates)``, ``L`` the drafts proposed there
that the target would accept in a row.  A step at position t with depth k yields
``min(k, L_t) + 1`` tokens and costs
``T(k) = T0 + c_draft * drafting + c_first * [k > 0] + d * k`` milliseconds (``drafting`` is 0
only for "fixed k=0", i.e. speculation off; under the controller the drafter runs even when
k = 0, unless a replay skips the idle drafter, as the engine does for DFlash and ``draft_model``).
Requests run one after another (a single stream, like the user's box); adaptive estimates
carry over between requests.

With draft confidences (``ConfidenceModel``), every position also carries one feature per
draft: drawn around ``right`` for a draft the target would accept, around ``wrong`` otherwise
(drafts past the first rejected one: right with the position's rate), so a policy sees noisy
per-draft evidence of known ROC-AUC; a step drafting J positions and verifying k costs
``T0 + c_draft + c_first * [k > 0] + d * k + c_token * J``.

``calibrated_oracle`` is the best gate such confidences allow; ``replay_learning`` runs the
adaptive policy learning its costs from step times a ``NoisyMachine`` measures.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dspark_dynamic.core.acceptance import expected_tokens
from dspark_dynamic.core.adaptive import AdaptivePolicy
from dspark_dynamic.core.phase import Phase
from dspark_dynamic.core.policy import PhasePolicy
from dspark_lab.workloads import ConfidenceModel, Features, Position, Trace


@dataclass(frozen=True)
class CostModel:
    """T(k) = T0 + c_draft + (d + c_token) * k ms; ``draft_token_ms`` (c_token) is 0 for a
    parallel drafter (DSpark), the cost of one drafter forward for a sequential one."""

    t0_ms: float = 75.0
    draft_ms: float = 3.0
    verify_ms: float = 37.75
    draft_token_ms: float = 0.0
    first_ms: float = 0.0  # once for a step that verifies any draft (the verification path engaging)

    def step_ms(self, k: int, drafting: bool = True) -> float:
        first = self.first_ms if k else 0.0
        if not drafting:
            return self.t0_ms + first + self.verify_ms * k
        return self.t0_ms + self.draft_ms + first + (self.verify_ms + self.draft_token_ms) * k

    def gated_step_ms(self, k: int, drafted: int, idle_drafter_runs: bool = True) -> float:
        """A step that drafted ``drafted`` positions and verified ``k`` of them (the drafter
        runs even when it drafts nothing, unless ``idle_drafter_runs`` is false)."""
        draft = self.draft_ms if drafted or idle_drafter_runs else 0.0
        return (self.t0_ms + draft + (self.first_ms if k else 0.0) + self.verify_ms * k
                + self.draft_token_ms * drafted)

    @staticmethod
    def add_arguments(parser: Any) -> None:
        """--t0-ms / --draft-ms / --verify-ms / --draft-token-ms (defaults: the seed box's fit)."""
        parser.add_argument("--t0-ms", type=float, default=75.0, help="plain decode step, ms")
        parser.add_argument("--draft-ms", type=float, default=3.0, help="running the drafter, ms")
        parser.add_argument("--verify-ms", type=float, default=37.75, help="one more verified token, ms")
        parser.add_argument("--draft-token-ms", type=float, default=0.0,
                            help="one more drafted position (0: parallel drafter such as DSpark)")
        parser.add_argument("--first-ms", type=float, default=0.0,
                            help="once for a step that verifies any draft")

    @classmethod
    def from_arguments(cls, args: Any) -> "CostModel":
        return cls(args.t0_ms, args.draft_ms, args.verify_ms, args.draft_token_ms, args.first_ms)


@dataclass(frozen=True)
class NoisyMachine:
    """Step times as a shared machine measures them: each request runs ``exp(U(-swing, swing))``
    times the cost model's speed (a box whose speed moves between requests), each step a further
    ``exp(N(0, jitter))``.  Only what a learning policy is told changes; results stay on the cost
    model's clock, so policies compare on the same times."""

    swing: float = 0.35
    jitter: float = 0.1
    seed: int = 0


@dataclass
class Result:
    name: str
    tokens: int = 0
    ms: float = 0.0
    steps: int = 0
    verified: int = 0
    accepted: int = 0
    most_idle: int = 0  # the most steps one request ran without drafting (``replay_policy``)

    def add_step(self, k: int, L: int, ms: float) -> int:
        """Account one step that verified ``k`` drafts where ``L`` would be accepted; returns the
        drafts accepted."""
        m = min(k, L)
        self.tokens += m + 1
        self.ms += ms
        self.steps += 1
        self.verified += k
        self.accepted += m
        return m

    @property
    def tok_per_s(self) -> float:
        return 1000.0 * self.tokens / self.ms if self.ms else 0.0


def replay(trace: Trace, name: str, choose: Callable[[str, Position], int], cost: CostModel,
           drafting: bool = True, learn: Callable[[str, Phase, int, int, float], None] | None = None,
           finish: Callable[[str], None] | None = None) -> Result:
    """``choose(req, position) -> k``; only the oracles may look past ``position[0]`` (the phase)."""
    res = Result(name)
    for r, positions in enumerate(trace):
        req = f"req-{r}"
        t = 0
        while t < len(positions):
            phase, L, _ = positions[t]
            k = choose(req, positions[t])
            ms = cost.step_ms(k, drafting)
            m = res.add_step(k, L, ms)
            if learn is not None:
                learn(req, phase, k, m, ms)
            t += m + 1
        if finish is not None:
            finish(req)
    return res


def oracle_depth(rates: tuple[float, ...], cost: CostModel, max_k: int) -> int:
    """Best k knowing the step's true acceptance probabilities (a perfectly calibrated confidence)."""
    return max(range(max_k + 1), key=lambda k: expected_tokens(list(rates), k) / cost.step_ms(k))


def hindsight_depth(L: int, cost: CostModel, max_k: int) -> int:
    """Best k knowing how many drafts will be accepted (an unreachable upper bound)."""
    return max(range(max_k + 1), key=lambda k: (min(k, L) + 1) / cost.step_ms(k))


def feature_survivals(features: list[float], rates: tuple[float, ...], model: ConfidenceModel) -> list[float]:
    """``P(draft j accepted | the step's features)`` for j = 1..len(features), knowing the step's true
    conditional ``rates`` and how ``model`` draws a feature.  As ``draft_features`` generates
    them, draft ``j`` is right with its rate whatever came before (past the first wrong draft
    too) and its feature depends on that alone, so the survival is the running product of each
    draft's posterior ``a N(f; right) / (a N(f; right) + (1 - a) N(f; wrong))``."""
    out, s = [], 1.0
    spread2 = 2.0 * model.spread * model.spread
    for f, a in zip(features, rates):
        right = a * math.exp(-((f - model.right) ** 2) / spread2)
        wrong = (1.0 - a) * math.exp(-((f - model.wrong) ** 2) / spread2)
        s *= right / (right + wrong) if right + wrong > 0.0 else a
        out.append(s)
    return out


def calibrated_oracle(trace: Trace, features: Features, model: ConfidenceModel, cost: CostModel, n: int,
                      iterations: int = 20) -> Result:
    """The best a gate can do with perfectly calibrated confidences: it drafts ``n`` positions every
    step, knows each draft's exact probability (``feature_survivals``: the step's true rates and
    the confidence model), and verifies the prefix that maximises ``tokens - rate * ms`` at its own
    long-run ``rate`` (Dinkelbach's iteration: replayed until the rate it runs at is the rate it
    assumed).  With a parallel drafter (``draft_token_ms`` 0), for a gate that sees the same
    features it is the bound up to where in the trace the steps land (the rates change only at
    phase and stretch boundaries): tighter than the hindsight bound, which knows the outcomes."""
    survivals = [[feature_survivals(features[r][t][:n], pos[2], model) for t, pos in enumerate(positions)]
                 for r, positions in enumerate(trace)]
    step_ms = [cost.gated_step_ms(k, n) for k in range(n + 1)]
    rate, res = 0.0, Result("oracle, calibrated confidences")
    for _ in range(iterations):
        res = Result("oracle, calibrated confidences")
        for r, positions in enumerate(trace):
            t = 0
            while t < len(positions):
                s, best_k, best, tokens = survivals[r][t], 0, 1.0 - rate * step_ms[0], 1.0
                for k in range(1, n + 1):
                    tokens += s[k - 1]
                    value = tokens - rate * step_ms[k]
                    if value > best:
                        best_k, best = k, value
                t += res.add_step(best_k, positions[t][1], step_ms[best_k]) + 1
        new_rate = res.tokens / res.ms
        if abs(new_rate - rate) <= 1e-9 * new_rate:
            break
        rate = new_rate
    return res


def told_policy(cost: CostModel, n: int, reasoning_depth: int, answer_depth: int,
                confidence: bool = False, seed: int = 0) -> AdaptivePolicy:
    """The adaptive policy with up to ``n`` drafts, told the cost model's ratios (not learning them)."""
    return AdaptivePolicy(
        n,
        {Phase.REASONING: min(reasoning_depth, n), Phase.ANSWER: min(answer_depth, n)},
        verify_cost_ratio=cost.verify_ms / cost.t0_ms,
        draft_cost_ratio=cost.draft_ms / cost.t0_ms,
        draft_token_cost_ratio=cost.draft_token_ms / cost.t0_ms,
        learn_cost=False,
        confidence=confidence,
        idle_drafter_runs=True,  # the seed box's DSpark drafts its block every step (Model Runner V2)
        seed=seed,
    )


def replay_policy(trace: Trace, name: str, policy: Any, cost: CostModel, features: Features | None = None,
                  machine: NoisyMachine | None = None, idle_drafter_runs: bool = True,
                  drafts: int | None = None) -> Result:
    """A batch policy (``plan``, ``gate``, ``observe*``: the adaptive policy or a peer rule) on a
    single stream: each step it plans how deep to draft (``drafts``: always that many instead),
    gates the drafts (with their features, given ``features``), and learns from the outcome and
    the step's modelled time (as ``machine`` measures it, given one)."""
    res = Result(name)
    begin = getattr(policy, "begin_step", None)
    noise = random.Random(machine.seed) if machine is not None else None
    speed = 1.0
    for r, positions in enumerate(trace):
        req, t = f"req-{r}", 0
        if noise is not None:
            speed = math.exp(noise.uniform(-machine.swing, machine.swing))
        idle = 0
        while t < len(positions):
            phase, L, _ = positions[t]
            if begin is not None:
                begin()
            drafted = policy.plan([(phase, req)])[0]
            if drafts is not None:
                drafted = drafts
            idle += not drafted
            f = features[r][t][:drafted] if features is not None and drafted else None
            k = policy.gate([(phase, req, f, drafted)])[0] if drafted else 0
            ms = cost.gated_step_ms(k, drafted, idle_drafter_runs)
            m = res.add_step(k, L, ms)
            policy.observe(phase, k, m, req)
            if k and f is not None:
                policy.observe_confidence(phase, f[:k], k, m, req)
            measured = ms if noise is None else ms * speed * math.exp(noise.gauss(0.0, machine.jitter))
            policy.observe_step(measured / 1000.0, k, 1, drafted)
            t += m + 1
        policy.forget(req)
        res.most_idle = max(res.most_idle, idle)
    return res


def replay_adaptive(trace: Trace, cost: CostModel, n: int, reasoning_depth: int, answer_depth: int) -> Result:
    """The adaptive policy with up to ``n`` drafts, told the cost model's ratios, no confidences."""
    return replay_policy(trace, f"adaptive (k<={n})", told_policy(cost, n, reasoning_depth, answer_depth), cost)


def replay_confident(trace: Trace, features: Features, cost: CostModel, n: int, reasoning_depth: int,
                     answer_depth: int) -> Result:
    """The adaptive policy gating each step on its drafts' features (costs given, not learned)."""
    policy = told_policy(cost, n, reasoning_depth, answer_depth, confidence=True)
    return replay_policy(trace, f"adaptive + confidence (k<={n})", policy, cost, features)


def replay_learning(trace: Trace, cost: CostModel, n: int, reasoning_depth: int, answer_depth: int,
                    features: Features | None = None, machine: NoisyMachine | None = None,
                    drafts: int | None = None, seed: int = 0, prior: CostModel | None = None) -> Result:
    """The adaptive policy as an engine runs it: the costs learned from the measured step times
    (``machine``), with ``prior``'s ratios as configured (default: the true ``cost``'s), a
    drafter skipped when it drafts nothing (DFlash, ``draft_model``), gating on ``features``
    when given (``drafts``: draft that many on every step, the policy still gating them)."""
    told = prior or cost
    policy = AdaptivePolicy(
        n, {Phase.REASONING: min(reasoning_depth, n), Phase.ANSWER: min(answer_depth, n)},
        verify_cost_ratio=told.verify_ms / told.t0_ms, draft_cost_ratio=told.draft_ms / told.t0_ms,
        draft_token_cost_ratio=told.draft_token_ms / told.t0_ms, confidence=features is not None, seed=seed)
    name = "adaptive, learned costs" + (", drafting always" if drafts is not None else "")
    return replay_policy(trace, name, policy, cost, features, machine, idle_drafter_runs=False, drafts=drafts)


def replay_peers(trace: Trace, features: Features, cost: CostModel, n: int) -> list[Result]:
    """Each peer rule (``core.peers``) on the trace, gating on ``features`` where it reads them."""
    from dspark_dynamic.core.peers import PEERS

    return [replay_policy(trace, f"peer: {name}", make(n), cost, features) for name, make in PEERS.items()]


def compare(trace: Trace, cost: CostModel, max_k: int = 3, phase_depths: tuple[int, int] = (1, 2),
            adaptive_n: int | None = None, features: Features | None = None,
            confidence: ConfidenceModel | None = None) -> list[Result]:
    """Fixed k = 0..max_k, the phase policy, the adaptive policy (and, given ``features``, the
    adaptive policy gating on them and the peer rules; given also the ``confidence`` model that
    drew them, the calibrated oracle at each adaptive depth), the per-step oracle and the
    hindsight bound."""
    results = [replay(trace, "fixed k=0 (no speculation)", lambda r, pos: 0, cost, drafting=False)]
    for k in range(1, max_k + 1):
        results.append(replay(trace, f"fixed k={k}", lambda r, pos, k=k: k, cost))
    reasoning_depth, answer_depth = phase_depths
    phase = PhasePolicy(reasoning_depth, answer_depth)
    results.append(replay(trace, f"phase {reasoning_depth}/{answer_depth}", lambda r, pos: phase.depth(pos[0], r), cost))
    for n in sorted({min(answer_depth, max_k), max_k} if adaptive_n is None else {adaptive_n}):
        results.append(replay_adaptive(trace, cost, n, reasoning_depth, answer_depth))
        if features is not None:
            results.append(replay_confident(trace, features, cost, n, reasoning_depth, answer_depth))
            results.extend(replay_peers(trace, features, cost, n))
    if features is not None and confidence is not None:
        for n in sorted({min(answer_depth, max_k), max_k} if adaptive_n is None else {adaptive_n}):
            oracle = calibrated_oracle(trace, features, confidence, cost, n)
            oracle.name += f" (k<={n})"
            results.append(oracle)
    if all(pos[2] for positions in trace for pos in positions[:1]):
        results.append(replay(trace, "oracle per step", lambda r, pos: oracle_depth(pos[2], cost, max_k), cost))
    results.append(replay(trace, "hindsight bound", lambda r, pos: hindsight_depth(pos[1], cost, max_k), cost))
    return results


def modeled_tok_per_s(phases: dict, cost: CostModel, drafting: bool = True) -> float:
    """tok/s of a controller snapshot (``PhaseStats.snapshot()``) if each request-step at depth k
    cost ``cost.step_ms(k)``; counts come from a real engine run."""
    tokens = ms = 0.0
    for phase in phases.values():
        tokens += phase["tokens"]
        for k, count in phase["depth_counts"].items():
            ms += count * cost.step_ms(int(k), drafting)
    return 1000.0 * tokens / ms if ms else 0.0


def fresh_engine_drafting(seed: int, steps: int = 1000, noise: float = 0.03, early: int = 200) -> tuple[int, int]:
    """The steps a fresh single-request adaptive policy (defaults 2/2, no confidences) drafts on,
    among its first ``early`` and in all ``steps``, on a machine where drafting never pays: a step
    10 ms, each position drafted 3 ms, each verified draft 2 ms and 1 ms once for any, half of
    the drafts accepted; every step's time drawn within ``noise`` of its cost.  Its first steps
    draft the default until the costs are solved; after that a step that drafts is a probe.  A
    seed drafting on most of its first ``early`` steps has a dead spot: a price its data does not
    move.  (Near a tie: one draft costs 16 ms for 1.5 tokens, against 10 ms for one.)"""
    policy = AdaptivePolicy(2, {Phase.REASONING: 2, Phase.ANSWER: 2}, confidence=False, seed=seed)
    rng = random.Random(seed)
    answer = Phase.ANSWER
    drafted = in_early = in_all = 0
    for step in range(steps):
        policy.begin_step()
        verified = policy.gate([(answer, "a", None, drafted)])[0] if drafted else 0
        accepted = 0
        while accepted < verified and rng.random() < 0.5:
            accepted += 1
        if verified:
            policy.observe(answer, verified, accepted, "a")
        (drafted,) = policy.plan([(answer, "a")])
        in_all += drafted > 0
        in_early += drafted > 0 and step < early
        ms = 10.0 + 3.0 * drafted + 2.0 * verified + (1.0 if verified else 0.0)
        policy.observe_step(ms * rng.uniform(1.0 - noise, 1.0 + noise) / 1e3, verified, 1, drafted)
    return in_early, in_all

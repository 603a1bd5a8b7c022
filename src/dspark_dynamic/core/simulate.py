"""Offline replay of acceptance traces under a step-cost model (pure logic).

A trace is a list of requests; a request is a list of token positions, each
``(phase, L, rates)``: ``L`` is how many drafts, proposed at that position, the target would
accept in a row, drawn from ``rates`` (the true conditional acceptance of draft 1, 2, ...).  A step at position t with depth k yields ``min(k, L_t) + 1`` tokens and costs
``T(k) = T0 + c_draft * drafting + d * k`` milliseconds (``drafting`` is 0 only for "fixed k=0",
i.e. speculation off; under the controller the drafter runs even when k = 0).
Requests run one after another (a single stream, like the user's box); adaptive estimates
carry over between requests.

With draft confidences (``ConfidenceModel``), every position also carries one feature per
draft: drawn around ``right`` for a draft the target would accept, around ``wrong`` otherwise
(drafts past the first rejected one: right with the position's rate), so a policy sees noisy
per-draft evidence of known ROC-AUC; a step drafting J positions and verifying k costs
``T0 + c_draft + d * k + c_token * J``.

Trace files are JSONL with one row per position: ``{"req": "r1", "phase": "reasoning", "L": 2}``.
The controller's own trace (``trace_path``: rows with ``phase``, ``k``, ``accepted``) can be
turned into a trace with ``trace_from_controller_rows``: per phase, it keeps the recorded
phase lengths and replays the recorded per-position acceptance rates.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dspark_dynamic.core.adaptive import AdaptivePolicy, expected_tokens
from dspark_dynamic.core.phase import Phase
from dspark_dynamic.core.policy import PhasePolicy

Position = tuple[Phase, int, tuple[float, ...]]
Trace = list[list[Position]]
MAX_L = 6


@dataclass(frozen=True)
class CostModel:
    """T(k) = T0 + c_draft + (d + c_token) * k ms; ``draft_token_ms`` (c_token) is 0 for a
    parallel drafter (DSpark), the cost of one drafter forward for a sequential one."""

    t0_ms: float = 75.0
    draft_ms: float = 3.0
    verify_ms: float = 37.75
    draft_token_ms: float = 0.0

    def step_ms(self, k: int, drafting: bool = True) -> float:
        if not drafting:
            return self.t0_ms + self.verify_ms * k
        return self.t0_ms + self.draft_ms + (self.verify_ms + self.draft_token_ms) * k

    def gated_step_ms(self, k: int, drafted: int) -> float:
        """A step that drafted ``drafted`` positions and verified ``k`` of them."""
        return self.t0_ms + self.draft_ms + self.verify_ms * k + self.draft_token_ms * drafted

    @staticmethod
    def add_arguments(parser: Any) -> None:
        """--t0-ms / --draft-ms / --verify-ms / --draft-token-ms (defaults: the seed box's fit)."""
        parser.add_argument("--t0-ms", type=float, default=75.0, help="plain decode step, ms")
        parser.add_argument("--draft-ms", type=float, default=3.0, help="running the drafter, ms")
        parser.add_argument("--verify-ms", type=float, default=37.75, help="one more verified token, ms")
        parser.add_argument("--draft-token-ms", type=float, default=0.0,
                            help="one more drafted position (0: parallel drafter such as DSpark)")

    @classmethod
    def from_arguments(cls, args: Any) -> "CostModel":
        return cls(args.t0_ms, args.draft_ms, args.verify_ms, args.draft_token_ms)


def _position(rng: random.Random, phase: Phase, rates: tuple[float, ...]) -> Position:
    n = 0
    while n < MAX_L and rng.random() < rates[n]:
        n += 1
    return (phase, n, rates)


def _flat(p: float) -> tuple[float, ...]:
    return (p,) * MAX_L


def synthetic_trace(
    segments: Iterable[tuple[Phase, int, Callable[[int], float]]],
    requests: int,
    seed: int = 0,
) -> Trace:
    """Each request is the concatenation of segments (phase, length, p(position))."""
    rng = random.Random(seed)
    segments = list(segments)
    trace: Trace = []
    for _ in range(requests):
        positions: list[Position] = []
        for phase, length, p_of in segments:
            positions.extend(_position(rng, phase, _flat(p_of(i))) for i in range(length))
        trace.append(positions)
    return trace


def seed_like_trace(requests: int = 20, seed: int = 0) -> Trace:
    """DeepSeek-V4 + DSpark as measured: ~40 % draft acceptance at k=2 while reasoning, ~90 % after.

    Per-position rate p with (p + p^2) / 2 = acceptance at k=2: p = 0.525 and 0.949.
    2000 reasoning tokens, then 600 answer tokens per request.
    """
    return synthetic_trace(
        [(Phase.REASONING, 2000, lambda i: 0.525), (Phase.ANSWER, 600, lambda i: 0.949)], requests, seed
    )


def bimodal_trace(requests: int = 20, seed: int = 1, run: int = 400) -> Trace:
    """Reasoning alternates between stretches of easy (p = 0.97) and hard (p = 0.08) drafts.

    Stretches last ``run`` tokens on average (e.g. copying code vs. exploring); the answer is easy.
    """
    rng = random.Random(seed)
    easy_rates, hard_rates, answer_rates = _flat(0.97), _flat(0.08), _flat(0.95)
    trace: Trace = []
    for _ in range(requests):
        positions: list[Position] = []
        easy = rng.random() < 0.5
        left = 0
        for _ in range(2000):
            if left == 0:
                easy = not easy
                left = max(20, int(rng.expovariate(1.0 / run)))
            left -= 1
            positions.append(_position(rng, Phase.REASONING, easy_rates if easy else hard_rates))
        positions.extend(_position(rng, Phase.ANSWER, answer_rates) for _ in range(600))
        trace.append(positions)
    return trace


def drifting_trace(requests: int = 20, seed: int = 2) -> Trace:
    """Acceptance drifts within each request: reasoning 0.8 -> 0.2, answer 0.95 -> 0.6."""
    return synthetic_trace(
        [
            (Phase.REASONING, 2000, lambda i: 0.8 - 0.6 * i / 2000),
            (Phase.ANSWER, 600, lambda i: 0.95 - 0.35 * i / 600),
        ],
        requests,
        seed,
    )


def drift_trace(requests: int = 20, seed: int = 4, reasoning: int = 2000, answer: int = 600) -> Trace:
    """Every draft is accepted in the first half of the reasoning section, none in the second;
    the answer is seed-like (p = 0.949).  A phase-level estimate averages the two halves, so only
    a policy that follows each request's own recent record can approach the per-step oracle."""
    half = reasoning // 2
    return synthetic_trace(
        [(Phase.REASONING, half, lambda i: 1.0), (Phase.REASONING, reasoning - half, lambda i: 0.0),
         (Phase.ANSWER, answer, lambda i: 0.949)],
        requests,
        seed,
    )


@dataclass(frozen=True)
class ConfidenceModel:
    """Per-draft features: Normal(``right``, ``spread``) for a draft the target accepts, Normal(
    ``wrong``, ``spread``) otherwise; ROC-AUC = Phi((right - wrong) / (spread * sqrt 2)).
    ``right == wrong``: an overconfident drafter whose confidence says nothing."""

    right: float = 2.0
    wrong: float = -0.2
    spread: float = 1.5

    @property
    def auc(self) -> float:
        z = (self.right - self.wrong) / (self.spread * math.sqrt(2.0))
        return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))

    @classmethod
    def with_auc(cls, auc: float, spread: float = 1.5, right: float = 2.0) -> "ConfidenceModel":
        lo, hi = 0.0, 20.0  # bisection on the gap (AUC rises with it)
        for _ in range(60):
            mid = (lo + hi) / 2
            if cls(right, right - mid, spread).auc < auc:
                lo = mid
            else:
                hi = mid
        return cls(right, right - (lo + hi) / 2, spread)


Features = list[list[list[float]]]  # [request][position][draft]


def draft_features(trace: Trace, model: ConfidenceModel, n: int, seed: int = 7) -> Features:
    """One feature per draft for every position of ``trace`` (the same for every policy)."""
    rng = random.Random(seed)
    out: Features = []
    for positions in trace:
        rows = []
        for _phase, L, rates in positions:
            row = []
            for j in range(n):
                if j < L:
                    right = True
                elif j == L:
                    right = False
                else:  # past the first rejected draft: right as often as the position's rate
                    right = rng.random() < (rates[j] if j < len(rates) else 0.5)
                row.append(rng.gauss(model.right if right else model.wrong, model.spread))
            rows.append(row)
        out.append(rows)
    return out


def trace_from_controller_rows(rows: Iterable[dict], seed: int = 3) -> Trace:
    """Rebuild a replayable trace from the controller's JSONL rows (phase, k, accepted, tokens).

    Acceptance beyond the verified depth is unobserved there, so each phase's per-position
    conditional rates are estimated from the rows and positions are re-drawn from them.
    """
    succ: dict[Phase, list[int]] = {p: [0] * MAX_L for p in Phase}
    seen: dict[Phase, list[int]] = {p: [0] * MAX_L for p in Phase}
    lengths: dict[str, dict[Phase, int]] = {}
    for row in rows:
        if "phase" not in row:
            continue
        phase = Phase.REASONING if row["phase"] == "reasoning" else Phase.ANSWER
        k, m = int(row.get("k", 0)), int(row.get("accepted", 0))
        for j in range(min(k, m + 1, MAX_L)):
            seen[phase][j] += 1
            succ[phase][j] += 1 if j < m else 0
        req = lengths.setdefault(str(row.get("req", "")), {})
        req[phase] = req.get(phase, 0) + int(row.get("tokens", m + 1))

    def rates(phase: Phase) -> list[float]:
        out: list[float] = []
        for j in range(MAX_L):
            out.append(succ[phase][j] / seen[phase][j] if seen[phase][j] else (out[-1] if out else 0.0))
        return out

    table = {p: tuple(rates(p)) for p in Phase}
    rng = random.Random(seed)
    trace: Trace = []
    for per_phase in lengths.values():
        positions: list[Position] = []
        for phase in (Phase.REASONING, Phase.ANSWER):
            positions.extend(_position(rng, phase, table[phase]) for _ in range(per_phase.get(phase, 0)))
        if positions:
            trace.append(positions)
    return trace


def load_trace(path: str) -> Trace:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    if rows and all("L" in r for r in rows):
        by_req: dict[str, list[Position]] = {}
        for r in rows:
            phase = Phase.REASONING if r["phase"] == "reasoning" else Phase.ANSWER
            true_rates = tuple(r["rates"]) if "rates" in r else ()
            by_req.setdefault(str(r.get("req", "")), []).append((phase, int(r["L"]), true_rates))
        return list(by_req.values())
    return trace_from_controller_rows(rows)


@dataclass
class Result:
    name: str
    tokens: int = 0
    ms: float = 0.0
    steps: int = 0
    verified: int = 0
    accepted: int = 0

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
            m = min(k, L)
            ms = cost.step_ms(k, drafting)
            res.tokens += m + 1
            res.ms += ms
            res.steps += 1
            res.verified += k
            res.accepted += m
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


def replay_policy(trace: Trace, name: str, policy: Any, cost: CostModel, features: Features | None = None) -> Result:
    """A batch policy (``plan``, ``gate``, ``observe*``: the adaptive policy or a peer rule) on a
    single stream: each step it plans how deep to draft, gates the drafts (with their features,
    given ``features``), and learns from the outcome and the step's modelled time."""
    res = Result(name)
    begin = getattr(policy, "begin_step", None)
    for r, positions in enumerate(trace):
        req, t = f"req-{r}", 0
        while t < len(positions):
            phase, L, _ = positions[t]
            if begin is not None:
                begin()
            drafted = policy.plan([(phase, req)])[0]
            f = features[r][t][:drafted] if features is not None and drafted else None
            k = policy.gate([(phase, req, f, drafted)])[0] if drafted else 0
            m = min(k, L)
            ms = cost.gated_step_ms(k, drafted)
            res.tokens += m + 1
            res.ms += ms
            res.steps += 1
            res.verified += k
            res.accepted += m
            policy.observe(phase, k, m, req)
            if k and f is not None:
                policy.observe_confidence(phase, f[:k], k, m, req)
            policy.observe_step(ms / 1000.0, k, 1, drafted)
            t += m + 1
        policy.forget(req)
    return res


def replay_adaptive(trace: Trace, cost: CostModel, n: int, reasoning_depth: int, answer_depth: int) -> Result:
    """The adaptive policy with up to ``n`` drafts, told the cost model's ratios, no confidences."""
    return replay_policy(trace, f"adaptive (k<={n})", told_policy(cost, n, reasoning_depth, answer_depth), cost)


def replay_confident(trace: Trace, features: Features, cost: CostModel, n: int, reasoning_depth: int,
                     answer_depth: int) -> Result:
    """The adaptive policy gating each step on its drafts' features (costs given, not learned)."""
    policy = told_policy(cost, n, reasoning_depth, answer_depth, confidence=True)
    return replay_policy(trace, f"adaptive + confidence (k<={n})", policy, cost, features)


def replay_peers(trace: Trace, features: Features, cost: CostModel, n: int) -> list[Result]:
    """Each peer rule (``core.peers``) on the trace, gating on ``features`` where it reads them."""
    from dspark_dynamic.core.peers import PEERS

    return [replay_policy(trace, f"peer: {name}", make(n), cost, features) for name, make in PEERS.items()]


def compare(trace: Trace, cost: CostModel, max_k: int = 3, phase_depths: tuple[int, int] = (1, 2),
            adaptive_n: int | None = None, features: Features | None = None) -> list[Result]:
    """Fixed k = 0..max_k, the phase policy, the adaptive policy (and, given ``features``, the
    adaptive policy gating on them and the peer rules), the per-step oracle and the hindsight
    bound."""
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

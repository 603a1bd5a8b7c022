"""Acceptance traces for the simulator (pure logic): synthetic workloads, per-draft confidence
features of a known ROC-AUC, and traces read from files or the controller's own trace.

A trace is a list of requests; a request is a list of token positions, each
``(phase, L, rates)``: ``L`` is how many drafts, proposed at that position, the target would
accept in a row, drawn from ``rates`` (the true conditional acceptance of draft 1, 2, ...).
Trace files are JSONL with one row per position: ``{"req": "r1", "phase": "reasoning", "L": 2}``;
``trace_from_controller_rows`` turns the controller's trace (``trace_path``) into one, keeping
per phase the recorded phase lengths and replaying the recorded per-position acceptance rates.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dspark_dynamic.core.phase import Phase

Position = tuple[Phase, int, tuple[float, ...]]
Trace = list[list[Position]]
MAX_L = 6


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

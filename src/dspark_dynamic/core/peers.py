"""The peers' depth rules, written from their published descriptions, for side-by-side runs
(pure logic; the benchmark and the simulator select them, as does ``policy`` in the options).

Each implements the batch-policy interface of ``AdaptivePolicy`` (``begin_step``, ``plan``,
``gate``, ``observe``, ``observe_confidence``, ``observe_step``, ``forget``, ``describe``) and
reads what its source reads; where a source is silent, the choice is said.  Confidences are the
drafter's features (``confidence.py``): ``sigmoid(feature)`` is the drafter's top-1 probability.

- ``VllmAdaptiveVerification`` (vllm-project/vllm#47808; vLLM 0.33
  ``v1/worker/gpu/spec_decode/adaptive_verification.py``): every step drafts ``N``; all draft
  slots are ranked by survival (running products of per-position confidences) and the verified
  budget is the global argmax of ``(requests + top-b survivals) / (draft_ms + verify_ms[tokens])``
  (ties to the smaller), allotted to the top-``b`` slots.  Confidences are the phase
  calibrator's probabilities (the DSpark head is trained to be calibrated; vLLM's online
  estimator is a logistic calibration too), smoothed per request and position by an EMA with
  ``0.8`` on the previous value (the PR's ``adaptive_verification_ema_alpha``; the merged code
  uses raw confidences).  Costs: a table of step time by target tokens, profiled once (here over
  the first ``PROFILE_STEPS`` decode steps, cycling the budget through its sizes, as vLLM replays
  each size at start-up) and never updated; an unprofiled size reads the next larger one.
- ``FreeTokenWidth`` (FlashML-org/FreeToken#71): every step drafts ``N`` and verifies one width
  ``k`` for the batch, the ``k`` in ``0..N`` maximising ``E(k) / (D + V(k))``: ``E(k)`` the
  expected emitted tokens (one per request plus its survivals up to ``k``), ``D + V(k)`` the step
  time measured at width ``k`` (profiled like the above per batch size, then fixed; #71
  calibrates on the deployed geometry).
- ``BreakEvenPause`` (antirez/ds4 #731, ``DS4_DSPARK_SCHEDULER_BREAK_EVEN_WINDOW``; as ported in
  Luce-Org/lucebox's ``DSparkProfitScheduler``): speculates at ``N``; per speculative step it
  adds ``max(0, elapsed - plain)`` to the extra time and ``plain per token * accepted`` to the
  saved time, ``plain`` being the smoothed time of a plain step (``0.75 old + 0.25 new``) at the
  batch's size; after ``WINDOW`` speculative steps where extra exceeds saved it pauses (depth 0)
  for ``SKIP`` steps, then speculates again with a fresh window.  It starts with ``WINDOW``
  plain steps to measure ``plain``.
- ``PMin`` (llama.cpp ``common/speculative.cpp``): a request's drafts are verified up to, not
  including, the first whose top-1 probability is below ``p_min`` (0.75, llama.cpp's default
  before it became 0); drafting is ``N`` every step (llama.cpp's sequential drafter would stop
  drafting there too; vLLM's drafter drafts its block).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from dspark_dynamic.core.acceptance import sigmoid, survival
from dspark_dynamic.core.confidence import ConfidenceCalibrator
from dspark_dynamic.core.phase import Phase

Item = tuple[Phase, str, "list[float] | None", int]


class _Peer:
    """What every peer shares: ``N`` drafted every step, per-phase calibrators where needed, and
    hooks that do nothing unless overridden."""

    name = "peer"
    uses_calibrator = False
    reads_confidences = False

    def __init__(self, num_speculative_tokens: int) -> None:
        self.n = num_speculative_tokens
        self.calibrators = {p: ConfidenceCalibrator(self.n) for p in Phase} if self.uses_calibrator else None
        self.confidence_seen = False
        self._drafted_now = 0

    def begin_step(self) -> None:
        return None

    def depth(self, phase: Phase, request_id: str | None = None) -> int:
        return self.n

    def plan(self, rows: list[tuple[Phase, str | None]]) -> list[int]:
        return [self.n] * len(rows)

    def observe(self, phase: Phase, verified: int, accepted: int, request_id: str | None = None) -> None:
        return None

    def observe_confidence(self, phase: Phase, features: list[float], verified: int, accepted: int,
                           request_id: str | None = None) -> None:
        if self.calibrators is not None:
            self.calibrators[phase].observe(features, verified, accepted)

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int,
                     context: float = 0.0, verified_context: float = 0.0) -> None:
        return None

    def forget(self, request_id: str) -> None:
        return None

    def describe(self, phase: Phase) -> str:
        return f"peer rule {self.name}"


class _Profile:
    """Step times by key over a profiling window, then a fixed table (median per key)."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.seen = 0
        self.samples: dict[Any, list[float]] = {}
        self.table: dict[Any, float] | None = None

    @property
    def profiling(self) -> bool:
        return self.table is None

    def add(self, key: Any, seconds: float) -> None:
        if self.table is not None:
            return
        self.samples.setdefault(key, []).append(seconds)
        self.seen += 1
        if self.seen >= self.steps:
            self.table = {k: sorted(v)[len(v) // 2] for k, v in self.samples.items()}


PROFILE_STEPS = 96  # decode steps of the start-up profile (after the engine's first few)


class VllmAdaptiveVerification(_Peer):
    name = "vllm-av"
    uses_calibrator = reads_confidences = True
    EMA = 0.8  # weight of the previous smoothed confidence

    def __init__(self, num_speculative_tokens: int) -> None:
        super().__init__(num_speculative_tokens)
        self.smoothed: dict[str, list[float]] = {}
        self._monotone: dict[int, float] | None = None
        self.profile = _Profile(PROFILE_STEPS)
        self._cycle = 0
        self._skip = 16  # the engine's first steps are not profiled (caches, allocator)

    def _verify_ms(self, tokens: int) -> float:
        """The profiled step time at ``tokens`` target tokens: made monotone in tokens (as vLLM's
        ``maximum.accumulate``), the next profiled size up, linear beyond the largest."""
        table = self.profile.table or {}
        if not table:
            return float(tokens)
        if self._monotone is None:
            running, self._monotone = 0.0, {}
            for k in sorted(table):
                running = max(running, table[k])
                self._monotone[k] = running
        larger = [k for k in self._monotone if k >= tokens]
        if larger:
            return self._monotone[min(larger)]
        top = max(self._monotone)
        return self._monotone[top] * tokens / top

    def gate(self, items: list[Item], uniform: str | None = None) -> list[int]:
        self.confidence_seen = self.confidence_seen or any(f is not None for _p, _r, f, _a in items)
        slots = []
        for i, (phase, req, features, available) in enumerate(items):
            if features is None:
                continue
            raw = [sigmoid(z) for z in self.calibrators[phase].logits(features[:available])]
            prev = self.smoothed.get(req)
            conf = raw if prev is None else [self.EMA * p + (1.0 - self.EMA) * c for p, c in zip(prev, raw)] + raw[len(prev):]
            self.smoothed[req] = conf
            slots.extend((s, i) for s in survival(conf))
        requests = len(items)
        if self.profile.profiling:  # cycle the budget through its sizes
            budget = self._cycle % (len(slots) + 1)
            self._cycle += 1
        else:
            slots.sort(reverse=True)
            best, best_ratio, tokens = 0, -1.0, float(requests)
            for b in range(len(slots) + 1):
                if b:
                    tokens += slots[b - 1][0]
                ratio = tokens / self._verify_ms(requests + b)
                if ratio > best_ratio:
                    best, best_ratio = b, ratio
            budget = best
        slots.sort(reverse=True)
        depths = [0] * requests
        for _s, i in slots[:budget]:
            depths[i] += 1
        return depths

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int,
                     context: float = 0.0, verified_context: float = 0.0) -> None:
        if self._skip:
            self._skip -= 1
            return
        self.profile.add(num_requests + verified_tokens, seconds)

    def forget(self, request_id: str) -> None:
        self.smoothed.pop(request_id, None)


class FreeTokenWidth(_Peer):
    name = "freetoken"
    uses_calibrator = reads_confidences = True

    def __init__(self, num_speculative_tokens: int) -> None:
        super().__init__(num_speculative_tokens)
        self.profile = _Profile(PROFILE_STEPS)
        self._cycle = 0
        self._skip = 16
        self._width = 0

    def gate(self, items: list[Item], uniform: str | None = None) -> list[int]:
        self.confidence_seen = self.confidence_seen or any(f is not None for _p, _r, f, _a in items)
        requests = len(items)
        survivals = [survival([sigmoid(z) for z in self.calibrators[p].logits(f[:a])]) if f is not None else []
                     for p, _r, f, a in items]
        if self.profile.profiling:
            k = self._cycle % (self.n + 1)
            self._cycle += 1
        else:
            table = self.profile.table or {}

            def step_time(width: int) -> float:
                t = table.get((requests, width))
                if t is None:  # not profiled at this batch size: the nearest profiled one, scaled
                    near = [(abs(r - requests), r) for r, w in table if w == width]
                    if not near:
                        return math.inf
                    r = min(near)[1]
                    t = table[(r, width)] * requests / r
                return t

            k = max(range(self.n + 1), key=lambda w: sum(1.0 + sum(s[:w]) for s in survivals) / step_time(w))
        self._width = k
        return [min(k, a) for _p, _r, _f, a in items]

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int,
                     context: float = 0.0, verified_context: float = 0.0) -> None:
        if self._skip:
            self._skip -= 1
            return
        self.profile.add((num_requests, self._width), seconds)


class BreakEvenPause(_Peer):
    name = "break-even"
    WINDOW = 4  # speculative steps per test (DS4_DSPARK_SCHEDULER_WINDOW's default)
    SKIP = 4  # steps paused after a break-even failure (ds4's SLOW_SKIP)

    def __init__(self, num_speculative_tokens: int) -> None:
        super().__init__(num_speculative_tokens)
        self.plain: dict[int, float] = {}  # batch size -> smoothed plain step seconds
        self.pause = self.WINDOW  # measure plain steps first
        self.extra = self.saved = 0.0
        self.cycles = 0
        self._accepted = 0
        self._speculating = False

    def plan(self, rows: list[tuple[Phase, str | None]]) -> list[int]:
        self._speculating = self.pause <= 0
        return [self.n if self._speculating else 0] * len(rows)

    def depth(self, phase: Phase, request_id: str | None = None) -> int:
        return self.plan([(phase, request_id)])[0]

    def gate(self, items: list[Item], uniform: str | None = None) -> list[int]:
        return [a for _p, _r, _f, a in items]

    def observe(self, phase: Phase, verified: int, accepted: int, request_id: str | None = None) -> None:
        self._accepted += accepted

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int,
                     context: float = 0.0, verified_context: float = 0.0) -> None:
        accepted, self._accepted = self._accepted, 0
        r = num_requests
        if draft_depth <= 0 and verified_tokens == 0:  # a plain step
            old = self.plain.get(r)
            self.plain[r] = seconds if old is None else 0.75 * old + 0.25 * seconds
            self.pause -= 1
            return
        plain = self.plain.get(r)
        if plain is None:
            near = [(abs(k - r), k) for k in self.plain]
            if not near:
                return
            k = min(near)[1]
            plain = self.plain[k] * r / k
        self.extra += max(0.0, seconds - plain)
        self.saved += plain / r * accepted
        self.cycles += 1
        if self.cycles >= self.WINDOW:
            if self.extra > self.saved:
                self.pause = self.SKIP
            self.extra = self.saved = 0.0
            self.cycles = 0


class PMin(_Peer):
    name = "p-min"
    reads_confidences = True
    P_MIN = 0.75

    def gate(self, items: list[Item], uniform: str | None = None) -> list[int]:
        self.confidence_seen = self.confidence_seen or any(f is not None for _p, _r, f, _a in items)
        depths = []
        for _phase, _req, features, available in items:
            if features is None:
                depths.append(available)
                continue
            k = 0
            while k < available and sigmoid(features[k]) >= self.P_MIN:
                k += 1
            depths.append(k)
        return depths


PEERS: dict[str, Callable[[int], Any]] = {
    VllmAdaptiveVerification.name: VllmAdaptiveVerification,
    FreeTokenWidth.name: FreeTokenWidth,
    BreakEvenPause.name: BreakEvenPause,
    PMin.name: PMin,
}

"""Batches of requests of different context lengths under a step cost with a context term (pure logic).

The step cost (``ContextCost``; milliseconds).  ``R`` requests, request ``r`` with ``ctx_r`` tokens
of context (prompt and output so far) verifying ``k_r`` of the ``D`` positions the batch drafted::

    T = T0 + c_req (R - 1) + c_draft [drafting] + c_token D R + c_first [any k_r > 0]
        + c_ctx_base * sum_r ctx_r + sum_r k_r (d + c_ctx_verify * ctx_r)

Assumptions, with their sources (every coefficient is a command-line argument):

- ``T0`` 75, ``d`` 37.75, ``c_draft`` 3 ms: ``simulate.CostModel``'s seed-box fit (DeepSeek-V4-Flash,
  one RTX 5090, routed experts on DDR5, DSpark with N = 2: 11.9 tok/s at ~40 % acceptance and 17.9
  at ~90 %, both at k = 2; the shared notes' anchors_perf.md §3).  ``T0`` is taken at a short
  context (the seed runs' context was not recorded); the context term comes on top.
- ``c_req`` = ``d`` (assumption): another request's token is one more row through the CPU-resident
  experts, as a verified draft is (the union of top-6 experts grows nearly linearly, ibid. §3.2).
- The drafter runs once per step (``c_draft``), whatever it drafts (Model Runner V2 drafts its block
  every step); ``c_token`` 0 (a parallel drafter).
- ``c_ctx`` (one query row reading its request's context, per context token).  Measured (issue #50,
  the testbed: SmolLM2-135M float32 on vLLM CPU): a verified draft is about free at 200 tokens and
  costs ~6.7 ms at ~4,350 on a ~38 ms step, ~1.6 us per token; SmolLM2 reads 46 KB of K/V per token
  and row (30 layers, K and V, 3 heads of 64, float32), ~29 GB/s.  **Assumed** for the seed box:
  V4-Flash's attention on the RTX 5090 reads ~0.75 KB per context token and row (the indexer's
  keys of the 4x-compressed layers and the 128x-compressed entries, about half the 43 layers each;
  the top-k sparse part does not grow with context) at ~1 TB/s effective: 1.6 us x (0.75 / 46) x
  (29 / 1000) = ~0.75 ns per token and row, for the request's own row (``c_ctx_base``) and each
  verified draft (``c_ctx_verify``).  Cross-check: V4-Flash on two DGX Sparks, 37.3 tok/s at a
  short context and 32.2 at 634K (MTP k = 6, 25.7 % accepted; MiaAI-Lab/DeepSeek-v4-Flash-DSpark-
  2x-DGX-Spark#22) is +10.8 ms on a 7-row step, ~2.4 ns per token and row at 2 x 273 GB/s, ~0.74 ns
  at the 5090's 1.79 TB/s.  So at 256K a verified draft costs ~0.2 ms more than at 1K (d = 37.75).
- ``testbed`` preset (a stress case, not the seed box): the testbed's ratio on the seed box's step,
  1.6 us x 75 / 38 = ~3.2 us per token and row (256K: ~0.84 s a row): attention as heavy relative
  to the step as on the testbed (dense K/V, CPU attention), where the context term decides.

A batch (``run_batch``): ``R`` slots, each with its prompt length and its own seed-like trace
(``workloads``: reasoning then answer; the slots start staggered through their first request); a
finished request is followed in its slot by the next of its trace, at the same prompt length.
Each step every request drafts the batch's depth (the largest the policy plans), the policy gates
each request's drafts (with their confidences), and learns from the outcome and the step's time
(``NoisyMachine`` noise; the speed redrawn every ``SWING_EVERY`` steps).  Before ``plan`` and
``gate`` the driver sets ``policy.contexts[request_id]`` (policies that read context, in
``costs.context_units``) and, for the oracle, ``policy.tokens[request_id]`` (in tokens) and
``policy.truth[request_id]`` (the position's true rates).  vLLM's adaptive verification
profiles its costs at one context (``VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN``, 8192): while
it profiles, it is told the step's time at that context for every request.

``ContextOracle`` knows the cost and each draft's calibrated survival (``simulate.feature_survivals``)
and verifies, per request, the drafts whose survival beats ``rate * (d + c_ctx_verify * ctx_r)``,
at the long-run ``rate`` it runs at (Dinkelbach's iteration, as ``simulate.calibrated_oracle``).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from dspark_dynamic.core.adaptive import AdaptivePolicy
from dspark_dynamic.core.costs import context_units
from dspark_dynamic.core.peers import FreeTokenWidth, VllmAdaptiveVerification
from dspark_dynamic.core.phase import Phase
from dspark_dynamic.core.policy import PhasePolicy
from dspark_lab.simulate import CostModel, NoisyMachine, Result, feature_survivals
from dspark_lab.workloads import ConfidenceModel, Features, Trace, draft_features, seed_like_trace

K = 1024
CONTEXTS = {"1k": K, "8k": 8 * K, "32k": 32 * K, "128k": 128 * K, "256k": 256 * K}
MIXES = {  # name -> prompt lengths of the batch's requests
    "1k + 128k": ("1k", "128k"),
    "8k + 256k": ("8k", "256k"),
    "32k + 32k": ("32k", "32k"),
    "1k + 8k + 32k + 128k": ("1k", "8k", "32k", "128k"),
    "1k + 1k + 256k + 256k": ("1k", "1k", "256k", "256k"),
}
PRESETS = {"seed": 0.75, "testbed": 3200.0}  # ns per context token and row (see the docstring)
PROFILE_CONTEXT = 8192  # vLLM's VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN default
SWING_EVERY = 1000  # steps between redraws of the noisy machine's speed


@dataclass(frozen=True)
class ContextCost:
    """The step cost above: ``cost`` the seed box's terms, ``request_ms`` each request past the
    first, ``ctx_base_ns`` / ``ctx_verify_ns`` per context token of a request's row / verified draft."""

    cost: CostModel = CostModel()
    request_ms: float = 37.75
    ctx_base_ns: float = PRESETS["seed"]
    ctx_verify_ns: float = PRESETS["seed"]

    def verify_ms(self, context: int) -> float:
        """One verified draft of a request with ``context`` tokens."""
        return self.cost.verify_ms + 1e-6 * self.ctx_verify_ns * context

    def fixed_ms(self, contexts: list[int], drafted: int, drafting: bool = True) -> float:
        """The step without its verified drafts and their first-verified term."""
        c = self.cost
        return (c.t0_ms + self.request_ms * (len(contexts) - 1) + (c.draft_ms if drafting else 0.0)
                + c.draft_token_ms * drafted * len(contexts) + 1e-6 * self.ctx_base_ns * sum(contexts))

    def step_ms(self, ks: list[int], contexts: list[int], drafted: int, drafting: bool = True) -> float:
        first = self.cost.first_ms if any(ks) else 0.0
        return self.fixed_ms(contexts, drafted, drafting) + first + sum(
            k * self.verify_ms(c) for k, c in zip(ks, contexts))

    @staticmethod
    def add_arguments(parser: Any) -> None:
        """--context-costs / --ctx-base-ns / --ctx-verify-ns / --request-ms (``CostModel``'s besides)."""
        parser.add_argument("--context-costs", choices=sorted(PRESETS), default="seed",
                            help="the context term: seed (bandwidth-scaled, 0.75 ns per token and row) or "
                                 "testbed (the testbed's ratio on the seed step, 3.2 us)")
        parser.add_argument("--ctx-base-ns", type=float, default=None,
                            help="ns per context token for each request's own row (default: the preset)")
        parser.add_argument("--ctx-verify-ns", type=float, default=None,
                            help="ns per context token for each verified draft (default: the preset)")
        parser.add_argument("--request-ms", type=float, default=None,
                            help="each request past the first, ms (default: --verify-ms)")

    @classmethod
    def from_arguments(cls, args: Any) -> "ContextCost":
        cost = CostModel.from_arguments(args)
        preset = PRESETS[args.context_costs]
        return cls(cost, cost.verify_ms if args.request_ms is None else args.request_ms,
                   preset if args.ctx_base_ns is None else args.ctx_base_ns,
                   preset if args.ctx_verify_ns is None else args.ctx_verify_ns)


class _Rule:
    """A rule that learns nothing (the batch-policy interface, its hooks doing nothing)."""

    speculates = True

    def begin_step(self) -> None:
        return None

    def observe(self, phase: Phase, verified: int, accepted: int, request_id: str | None = None) -> None:
        return None

    def observe_confidence(self, *args: Any) -> None:
        return None

    def observe_step(self, seconds: float, verified_tokens: int, num_requests: int, draft_depth: int,
                     context: int = 0, verified_context: int = 0) -> None:
        return None

    def forget(self, request_id: str) -> None:
        return None


class FixedRule(_Rule):
    """Every request verifies ``k`` (0: speculation off, the drafter never runs)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.speculates = k > 0

    def plan(self, rows: list) -> list[int]:
        return [self.k] * len(rows)

    def gate(self, items: list) -> list[int]:
        return [min(self.k, available) for _p, _r, _f, available in items]


class PhaseRule(_Rule):
    """``PhasePolicy``'s depth per request; the batch drafts the deepest."""

    def __init__(self, reasoning: int, answer: int) -> None:
        self.policy = PhasePolicy(reasoning, answer)

    def plan(self, rows: list) -> list[int]:
        return [self.policy.depth(phase, req) for phase, req in rows]

    def gate(self, items: list) -> list[int]:
        return [min(self.policy.depth(phase, req), available) for phase, req, _f, available in items]


class ContextOracle(_Rule):
    """Drafts ``n``; verifies, per request, the prefix of drafts whose calibrated survival beats
    ``rate`` times their true verify cost (at the step's contexts; ``context_aware`` false: every
    draft priced at the batch's mean context); nothing if they do not pay the first-verified term."""

    def __init__(self, n: int, cost: ContextCost, model: ConfidenceModel, rate: float,
                 context_aware: bool = True) -> None:
        self.n, self.cost, self.model, self.rate = n, cost, model, rate
        self.context_aware = context_aware
        self.tokens: dict[str, int] = {}  # per request, its context in tokens (set by the driver)
        self.truth: dict[str, tuple[float, ...]] = {}

    def plan(self, rows: list) -> list[int]:
        return [self.n] * len(rows)

    def gate(self, items: list) -> list[int]:
        mean = sum(self.tokens[req] for _p, req, _f, _a in items) / len(items)
        depths, gain = [], 0.0
        for _phase, req, features, available in items:
            price = self.rate * self.cost.verify_ms(self.tokens[req] if self.context_aware else mean)
            k = 0
            for s in feature_survivals(features[:available], self.truth[req], self.model) if features else ():
                if s <= price:
                    break
                k += 1
                gain += s - price
            depths.append(k)
        if any(depths) and gain <= self.rate * self.cost.cost.first_ms:
            return [0] * len(items)
        return depths

    def forget(self, request_id: str) -> None:
        self.tokens.pop(request_id, None)
        self.truth.pop(request_id, None)


@dataclass
class Slot:
    """One place in the batch: its prompt, trace, drafts' features and where it is in them."""

    name: str
    prompt: int
    trace: Trace
    features: Features
    index: int = 0  # the request of the trace
    t: int = 0  # the position in it
    serial: int = 0  # requests started in this slot (names the request)

    @property
    def request_id(self) -> str:
        return f"{self.name}-{self.serial}"

    @property
    def context(self) -> int:
        return self.prompt + self.t


def make_slots(prompts: list[int], requests: int, n: int, model: ConfidenceModel, seed: int = 0) -> list[Slot]:
    """One slot per prompt length: its own seed-like trace and features, started ``i / R`` of the
    way through its first request (so the batch mixes phases)."""
    slots = []
    for i, prompt in enumerate(prompts):
        trace = seed_like_trace(requests, seed=seed + 17 * i)
        slots.append(Slot(f"slot{i}", prompt, trace, draft_features(trace, model, n, seed=seed + 17 * i + 7),
                          t=len(trace[0]) * i // len(prompts)))
    return slots


def run_batch(name: str, policy: Any, slots: list[Slot], cost: ContextCost, steps: int,
              machine: NoisyMachine | None = None, profile_context: int | None = None) -> Result:
    """``steps`` steps of the batch under ``policy`` (see the module docstring); ``slots`` advance.
    Results are on the cost model's clock; the policy is told the machine's measurement."""
    res = Result(name)
    contexts = getattr(policy, "contexts", None)  # a policy's, in ``costs.context_units``
    tokens = getattr(policy, "tokens", None)  # the oracle's, in tokens
    truth = getattr(policy, "truth", None)
    noise = random.Random(machine.seed) if machine is not None else None
    speed = 1.0
    drafting = getattr(policy, "speculates", True)
    for step in range(steps):
        if noise is not None and step % SWING_EVERY == 0:
            speed = math.exp(noise.uniform(-machine.swing, machine.swing))
        policy.begin_step()
        now = [s.trace[s.index][s.t] for s in slots]
        reqs = [s.request_id for s in slots]
        ctxs = [s.context for s in slots]
        if contexts is not None:
            for req, c in zip(reqs, ctxs):
                contexts[req] = context_units(c)
        if tokens is not None:
            tokens.update(zip(reqs, ctxs))
        if truth is not None:
            for req, pos in zip(reqs, now):
                truth[req] = pos[2]
        drafted = max(policy.plan([(pos[0], req) for pos, req in zip(now, reqs)])) if drafting else 0
        feats = [s.features[s.index][s.t][:drafted] if drafted else None for s in slots]
        items = [(pos[0], req, f, drafted) for pos, req, f in zip(now, reqs, feats)]
        ks = policy.gate(items) if drafted else [0] * len(slots)
        ms = cost.step_ms(ks, ctxs, drafted, drafting)
        res.ms += ms
        res.steps += 1
        for (phase, L, _), req, f, k, slot in zip(now, reqs, feats, ks, slots):
            m = min(k, L)
            res.tokens += m + 1
            res.verified += k
            res.accepted += m
            policy.observe(phase, k, m, req)
            if k and f is not None:
                policy.observe_confidence(phase, f[:k], k, m, req)
            slot.t += m + 1
        told = ms
        profile = getattr(policy, "profile", None)
        if profile_context is not None and profile is not None and profile.profiling:
            told = cost.step_ms(ks, [profile_context] * len(slots), drafted, drafting)
        if noise is not None:
            told *= speed * math.exp(noise.gauss(0.0, machine.jitter))
        policy.observe_step(told / 1000.0, sum(ks), len(slots), drafted, context=sum(map(context_units, ctxs)),
                            verified_context=sum(k * context_units(c) for k, c in zip(ks, ctxs)))
        for slot, req in zip(slots, reqs):
            if slot.t >= len(slot.trace[slot.index]):  # finished: the next request of the trace
                if contexts is not None:
                    contexts.pop(req, None)
                policy.forget(req)
                slot.index, slot.t, slot.serial = (slot.index + 1) % len(slot.trace), 0, slot.serial + 1
    return res


def adaptive_policy(n: int, cost: ContextCost, context_features: bool, seed: int = 0) -> AdaptivePolicy:
    """The adaptive policy as the seed box runs it: defaults 1/2, confidences, the drafter running
    every step, its costs learned from step times around the seed ratios (``context_features``: the
    constructor's keyword)."""
    c = cost.cost
    return AdaptivePolicy(n, {Phase.REASONING: min(1, n), Phase.ANSWER: min(2, n)},
                          verify_cost_ratio=c.verify_ms / c.t0_ms, draft_cost_ratio=c.draft_ms / c.t0_ms,
                          draft_token_cost_ratio=c.draft_token_ms / c.t0_ms, confidence=True,
                          idle_drafter_runs=True, seed=seed, context_features=context_features)


def oracle(prompts: list[int], cost: ContextCost, steps: int, n: int, model: ConfidenceModel, requests: int,
           context_aware: bool = True, iterations: int = 12, seed: int = 0) -> Result:
    """``ContextOracle`` at the rate it runs at (Dinkelbach's iteration from the no-draft rate)."""
    name = "oracle, calibrated" + ("" if context_aware else ", context-blind")
    rate, res = 0.0, Result(name)
    for _ in range(iterations):
        rule = ContextOracle(n, cost, model, rate, context_aware)
        res = run_batch(name, rule, make_slots(prompts, requests, n, model, seed), cost, steps)
        if abs(res.tok_per_s / 1000.0 - rate) <= 1e-6 * rate:
            break
        rate = res.tok_per_s / 1000.0
    return res


def compare_mix(prompts: list[int], cost: ContextCost, steps: int = 3000, n: int = 2, auc: float = 0.85,
                noisy: bool = True, profile_context: int = PROFILE_CONTEXT, seeds: int = 1) -> list[Result]:
    """Every policy on one mix, on the same slots (traces, features, machine) for each ``seed``,
    pooled over the seeds: fixed k = 0..n, phase 1/2, adaptive with context features off and on,
    vLLM-AV (profiled at ``profile_context``), FreeToken's width, and the calibrated oracle,
    context-blind and (last) knowing the context term."""
    model = ConfidenceModel.with_auc(auc)
    requests = steps // 600 + 2
    runs: list[list[Result]] = []
    for seed in range(seeds):
        machine = NoisyMachine(seed=100 + seed) if noisy else None

        def run(name: str, policy: Any, profiled: int | None = None) -> Result:
            slots = make_slots(prompts, requests, n, model, seed)
            return run_batch(name, policy, slots, cost, steps, machine, profiled)

        results = [run(f"fixed k={k}" + (" (no speculation)" if k == 0 else ""), FixedRule(k)) for k in range(n + 1)]
        results.append(run("phase 1/2", PhaseRule(min(1, n), min(2, n))))
        for on in (False, True):
            results.append(run(f"adaptive, context features {'on' if on else 'off'}",
                               adaptive_policy(n, cost, on, seed)))
        results.append(run(f"peer: vllm-av (profiled at {profile_context})", VllmAdaptiveVerification(n),
                           profile_context))
        results.append(run("peer: freetoken width", FreeTokenWidth(n)))
        for aware in (False, True):
            results.append(oracle(prompts, cost, steps, n, model, requests, aware, seed=seed))
        runs.append(results)
    pooled = []
    for same in zip(*runs):
        total = Result(same[0].name)
        for r in same:
            total.tokens, total.ms, total.steps = total.tokens + r.tokens, total.ms + r.ms, total.steps + r.steps
            total.verified, total.accepted = total.verified + r.verified, total.accepted + r.accepted
        pooled.append(total)
    return pooled


def table(title: str, results: list[Result]) -> str:
    """One mix's results against the last (the oracle): tok/s, ratio, accepted %, mean k per request-step."""
    best = results[-1].tok_per_s
    lines = [f"== {title}", f"{'policy':<42} {'tok/s':>7} {'vs oracle':>9} {'accept%':>8} {'mean k':>7}"]
    for r in results:
        acc = 100.0 * r.accepted / r.verified if r.verified else 0.0
        requests_steps = r.tokens - r.accepted  # one bonus token per request-step
        lines.append(f"{r.name:<42} {r.tok_per_s:>7.2f} {r.tok_per_s / best:>9.3f} {acc:>7.1f}% "
                     f"{r.verified / max(1, requests_steps):>7.2f}")
    return "\n".join(lines)


def ratio(results: list[Result], prefix: str) -> float:
    """The first result named ``prefix``... over the oracle's (the last) tok/s."""
    return next(r for r in results if r.name.startswith(prefix)).tok_per_s / results[-1].tok_per_s

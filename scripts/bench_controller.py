#!/usr/bin/env python3
"""Micro-benchmark: the controller's cost per request per step, and the prompt scan.

Drives ``DepthController`` exactly as the scheduler hook does (set_confidences for policies that
gate on draft confidences, before_schedule, then plan_drafts, after_output with the step's
counts, which calibrates the confidences, and a step time and the drafter depth ``plan_drafts``
asked for, which the cost model fits) over fake requests, and prints microseconds per
request-step.  Target: < 20 us.  Pure Python; no vLLM needed.  With torch installed it also
prints the worker-side capture cost per step (the confidence feature over a step's draft logits,
for the testbed's vocabulary and DeepSeek-V4's).  Marker sets: DeepSeek-V4's
single tokens (the fast path), and gpt-oss harmony's three-token channel headers (sequences
sharing their first and last token), the latter also with a stream in which every 10th token is
a header's last token without the rest of the header (candidates that must be checked).

    python scripts/bench_controller.py [--requests 2 8 64 256] [--steps 2000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import random
import time

from dspark_dynamic.core.controller import DepthController, StepTiming
from dspark_dynamic.core.phase import Phase, PhaseRules, RequestPhase
from dspark_dynamic.core.policy import BatchDepth, PhasePolicy
from dspark_lab.fakes import FakeRequest as Req

START, END, DSML = 128821, 128822, 128825
RULES = PhaseRules.of([START], [END, DSML])
# gpt-oss harmony ids: <|start|>, <|channel|>, <|message|>, analysis, final, commentary
H_START, CHANNEL, MESSAGE, ANALYSIS, FINAL, COMMENTARY = 200006, 200005, 200008, 35644, 17196, 12606
HARMONY = PhaseRules.of(
    [(CHANNEL, ANALYSIS, MESSAGE)], [(CHANNEL, FINAL, MESSAGE), (CHANNEL, COMMENTARY)], [H_START],
    default=Phase.REASONING,
)
# name -> (rules, prompt suffix that opens reasoning, output marker that ends it, candidate noise)
DRAFT_TOKEN_COST = 0.2  # a sequential drafter (draft_model, EAGLE): the gate also tracks drafting gains
MARKER_SETS = {
    "single": (RULES, [START], [END], None),
    "harmony": (HARMONY, [H_START, CHANNEL, ANALYSIS, MESSAGE], [CHANNEL, FINAL, MESSAGE], None),
    "harmony-noisy": (HARMONY, [H_START, CHANNEL, ANALYSIS, MESSAGE], [CHANNEL, FINAL, MESSAGE], MESSAGE),
}




def _accepted(fate: list[bool], verified: int) -> int:
    """Drafts accepted out of the first ``verified``: the leading run of accepted fates."""
    m = 0
    while m < verified and fate[m]:
        m += 1
    return m


POLICIES = ("phase", "phase+estimate", "adaptive", "adaptive+confidence")


def bench_steps(num_requests: int, steps: int, batch: BatchDepth, policy_name: str, markers: str = "single") -> float:
    rules, opens, closes, noise = MARKER_SETS[markers]
    rng = random.Random(0)
    confident = policy_name == "adaptive+confidence"
    if policy_name.startswith("adaptive"):
        from dspark_dynamic.adapter.build import build_policy
        from dspark_dynamic.core.options import parse_options

        raw = {"policy": "adaptive", "adaptive": {"confidence": confident, "draft_token_cost_ratio": DRAFT_TOKEN_COST}}
        policy = build_policy(parse_options(raw, 2))
    elif policy_name == "phase+estimate":  # the phase policy with the live estimate (core/live.py)
        from dspark_dynamic.adapter.build import build_policy
        from dspark_dynamic.core.options import parse_options

        raw = {"reasoning_depth": 1, "answer_depth": 2, "live_estimate": True,
               "adaptive": {"draft_token_cost_ratio": DRAFT_TOKEN_COST}}
        policy = build_policy(parse_options(raw, 2))
    else:
        policy = PhasePolicy(1, 2)
    ctl = DepthController(rules, policy, batch)
    reqs = [Req(f"r{i}", [rng.randrange(120000) for _ in range(2000)] + opens) for i in range(num_requests)]
    placeholder = [-1, -1]
    elapsed = 0.0
    for step in range(steps):
        for r in reqs:  # what vLLM does between two schedules (not timed)
            new = [rng.randrange(120000) for _ in range(rng.randint(1, 3))]
            if noise is not None and rng.random() < 0.2:
                new[-1] = noise  # about every 10th token
            r.output_token_ids.extend(new)
            if step == steps // 2:
                r.output_token_ids.extend(closes)  # split across steps by the next extends

            r.spec_token_ids = placeholder
        # each request's drafts: features, and outcomes that follow them (sigmoid of the feature),
        # so that the gate admits drafts and calibration gets labels, as with a real drafter
        features = [[rng.gauss(1.5, 2.0), rng.gauss(1.5, 2.0)] for _ in reqs]
        fates = [[rng.random() < 1.0 / (1.0 + math.exp(-f)) for f in fs] for fs in features]
        t0 = time.perf_counter()
        if confident:  # what update_draft_token_ids hands over with the draft ids
            for r, f in zip(reqs, features):
                ctl.set_confidences(r.request_id, f)
        decisions = ctl.before_schedule(reqs)
        planned = ctl.plan_drafts(reqs) or 0  # drafts asked per request: drafted in this step
        elapsed += time.perf_counter() - t0
        # what vLLM's output processing counts (not timed: vLLM does it with or without us)
        counted = {r.request_id: (len(r.spec_token_ids), _accepted(fate, len(r.spec_token_ids)))
                   for r, fate in zip(reqs, fates) if r.spec_token_ids}
        tokens = {r.request_id: 1 + counted.get(r.request_id, (0, 0))[1] for r in reqs}
        verified = sum(v for v, _ in counted.values())  # a step time for the cost model to fit
        timing = StepTiming(0.010 + 0.001 * len(reqs) + 0.004 * verified + (0.002 if verified else 0.0)
                            + 0.002 * planned * len(reqs) + rng.gauss(0.0, 0.0005), True, len(reqs), planned)
        t0 = time.perf_counter()
        ctl.after_output(decisions, counted, tokens, timing)
        elapsed += time.perf_counter() - t0
    return elapsed / (steps * num_requests) * 1e6


def bench_reference(repeats: int = 7) -> float:
    """Microseconds of a fixed pure-Python workload on this machine (best of ``repeats``): 100
    rounds of a call, attribute reads, float arithmetic, a dict lookup and a list append, the
    kinds of work a controller step does.  The controller's cost is also printed in this unit,
    so that runs on machines of different speed compare."""

    class Box:
        __slots__ = ("a", "b")

        def __init__(self) -> None:
            self.a, self.b = 0.5, 0.25

    def work(box: Box, table: dict, out: list) -> float:
        x = box.a * box.b + table.get("k", 0.0)
        out.append(x)
        return x

    box, table, best = Box(), {"k": 1.0}, float("inf")
    for _ in range(repeats):
        out: list = []
        t0 = time.perf_counter()
        for _ in range(2000):
            for _ in range(100):
                work(box, table, out)
            out.clear()
        best = min(best, (time.perf_counter() - t0) / 2000)
    return best * 1e6


def count_lines(num_requests: int, steps: int, policy_name: str) -> float:
    """Python lines the controller runs per request-step (``sys.settrace`` line events inside its
    calls, the same drive as ``bench_steps``): the machine-independent form of its cost."""
    import sys

    lines = 0

    def tracer(frame, event, arg):
        nonlocal lines
        if event == "line":
            lines += 1
        return tracer

    methods = ("set_confidences", "before_schedule", "plan_drafts", "after_output")
    originals = {name: getattr(DepthController, name) for name in methods}

    def traced(original):
        def call(self, *args, **kwargs):
            sys.settrace(tracer)
            try:
                return original(self, *args, **kwargs)
            finally:
                sys.settrace(None)
        return call

    try:
        for name, original in originals.items():
            setattr(DepthController, name, traced(original))
        bench_steps(num_requests, steps, BatchDepth.PER_REQUEST, policy_name)
    finally:
        for name, original in originals.items():
            setattr(DepthController, name, original)
    return lines / (steps * num_requests)


def bench_capture(shapes=((1, 2, 256), (1, 2, 129280), (8, 2, 129280)), repeats: int = 20) -> dict:
    """Milliseconds per step for the Model Runner V1 capture: the drafter's logits scored once per
    proposal (``log_max_prob``) and turned into features on the host (``feature_of_log_prob``),
    greedy and at temperature 0.6 (needs torch)."""
    try:
        import torch

        from dspark_dynamic.adapter.patches.confidence import log_max_prob
        from dspark_dynamic.core.confidence import feature_of_log_prob
    except ImportError:
        return {}
    out = {}
    for reqs, drafts, vocab in shapes:
        logits = torch.randn(reqs * drafts, vocab)
        for temperature in (None, torch.full((reqs,), 0.6)):
            def step() -> None:
                scores = log_max_prob(logits, temperature).reshape(reqs, drafts)
                [[feature_of_log_prob(v) for v in row] for row in scores.tolist()]
            step()  # warm-up
            t0 = time.perf_counter()
            for _ in range(repeats):
                step()
            label = "greedy" if temperature is None else "T=0.6"
            out[(reqs, drafts, vocab, label)] = (time.perf_counter() - t0) / repeats * 1e3
    return out


def bench_prompt_scan(n: int, marker_at: int | None, markers: str = "single") -> float:
    rules, opens, _, _ = MARKER_SETS[markers]
    prompt = [i % 120_000 for i in range(n)]  # ordinary ids, none of them a marker
    if marker_at is not None:
        prompt[marker_at - len(opens) + 1 : marker_at + 1] = opens
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        RequestPhase(rules, prompt)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 2, 8, 64, 256])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3, help="runs per setting; the best is printed")
    args = ap.parse_args()
    reference = bench_reference()
    print(f"reference: {reference:.2f} us for a fixed pure-Python workload on this machine (the unit 'ref' below)")
    print("controller cost per request per step (before_schedule + plan_drafts + after_output)")
    print(f"{'requests':>9} {'policy':>20} {'batch_depth':>12} {'markers':>14} {'us/req/step':>12} {'ref':>6}")
    for markers in MARKER_SETS:
        for policy in POLICIES:
            for batch in (BatchDepth.PER_REQUEST, BatchDepth.MAX):
                if markers != "single" and batch is BatchDepth.MAX:
                    continue  # the batch rule does not touch the marker path
                for n in args.requests:
                    # best of a few runs, each with a fresh controller: the machine's noise only adds
                    us = min(bench_steps(n, max(50, args.steps // max(1, n // 8)), batch, policy, markers)
                             for _ in range(args.repeats))
                    print(f"{n:>9} {policy:>20} {batch.value:>12} {markers:>14} {us:>12.2f} {us / reference:>6.2f}")
    print("\nPython lines run per request-step (machine-independent; single markers, per_request)")
    for policy in POLICIES:
        print(f"  {policy:>20}: " + ", ".join(f"{n} requests {count_lines(n, max(50, 1000 // max(1, n // 8)), policy):.0f}"
                                            for n in args.requests))
    capture = bench_capture()
    if capture:
        print("\nconfidence capture per engine step (worker: feature over the step's draft logits, CPU, ms)")
        for (reqs, drafts, vocab, label), ms in capture.items():
            print(f"  {reqs:>3} requests x {drafts} drafts, vocabulary {vocab:>6}, {label:>6}: {ms:8.3f}")
    print("\nprompt scan, once per request (ms)")
    for n, where, label in (
        (1_000_000, 999_999, "1M tokens, marker last (DeepSeek-V4 template)"),
        (1_000_000, 996_000, "1M tokens, marker 4000 tokens before the end"),
        (1_000_000, 500_000, "1M tokens, marker in the middle"),
        (1_000_000, None, "1M tokens, no marker at all (worst case)"),
    ):
        for markers in ("single", "harmony"):
            print(f"  {label:<50} {markers:>8} {bench_prompt_scan(n, where, markers):8.3f}")


if __name__ == "__main__":
    main()

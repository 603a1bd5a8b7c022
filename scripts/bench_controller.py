#!/usr/bin/env python3
"""Micro-benchmark: the controller's cost per request per step, and the prompt scan.

Drives ``DepthController`` exactly as the scheduler hook does (before_schedule, then
plan_drafts, after_output with the step's counts) over fake requests, and prints microseconds per
request-step.  Target: < 20 us.  Pure Python; no vLLM needed.

    python scripts/bench_controller.py [--requests 2 8 64 256] [--steps 2000]
"""

from __future__ import annotations

import argparse
import random
import time

from dspark_dynamic.core.controller import DepthController
from dspark_dynamic.core.phase import PhaseRules, RequestPhase
from dspark_dynamic.core.policy import BatchDepth, PhasePolicy
from dspark_dynamic.testing.fakes import FakeRequest as Req

START, END, DSML = 128821, 128822, 128825
RULES = PhaseRules.of([START], [END, DSML])




def bench_steps(num_requests: int, steps: int, batch: BatchDepth, policy_name: str) -> float:
    rng = random.Random(0)
    if policy_name == "adaptive":
        from dspark_dynamic.core.adaptive import AdaptivePolicy
        from dspark_dynamic.core.options import parse_options

        policy = AdaptivePolicy.from_options(parse_options({"policy": "adaptive"}, 2))
    else:
        policy = PhasePolicy(1, 2)
    ctl = DepthController(RULES, policy, batch)
    reqs = [Req(f"r{i}", [rng.randrange(120000) for _ in range(2000)] + [START]) for i in range(num_requests)]
    placeholder = [-1, -1]
    elapsed = 0.0
    for step in range(steps):
        for r in reqs:  # what vLLM does between two schedules (not timed)
            r.output_token_ids.extend((rng.randrange(120000),) * rng.randint(1, 3))
            if step == steps // 2:
                r.output_token_ids.append(END)
            r.spec_token_ids = placeholder
        t0 = time.perf_counter()
        decisions = ctl.before_schedule(reqs)
        ctl.plan_drafts(reqs)
        counted = {r.request_id: (len(r.spec_token_ids), len(r.spec_token_ids) // 2) for r in reqs if r.spec_token_ids}
        tokens = {r.request_id: 1 + len(r.spec_token_ids) // 2 for r in reqs}
        ctl.after_output(decisions, counted, tokens)
        elapsed += time.perf_counter() - t0
    return elapsed / (steps * num_requests) * 1e6


def bench_prompt_scan(n: int, marker_at: int | None) -> float:
    prompt = [i % 120_000 for i in range(n)]  # ordinary ids, none of them a marker
    if marker_at is not None:
        prompt[marker_at] = START
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        RequestPhase(RULES, prompt)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, nargs="+", default=[1, 2, 8, 64, 256])
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    print("controller cost per request per step (before_schedule + plan_drafts + after_output)")
    print(f"{'requests':>9} {'policy':>9} {'batch_depth':>12} {'us/req/step':>12}")
    for policy in ("phase", "adaptive"):
        for batch in (BatchDepth.PER_REQUEST, BatchDepth.MAX):
            for n in args.requests:
                us = bench_steps(n, max(50, args.steps // max(1, n // 8)), batch, policy)
                print(f"{n:>9} {policy:>9} {batch.value:>12} {us:>12.2f}")
    print("\nprompt scan, once per request (ms)")
    for n, where, label in (
        (1_000_000, 999_999, "1M tokens, marker last (DeepSeek-V4 template)"),
        (1_000_000, 996_000, "1M tokens, marker 4000 tokens before the end"),
        (1_000_000, 500_000, "1M tokens, marker in the middle"),
        (1_000_000, None, "1M tokens, no marker at all (worst case)"),
    ):
        print(f"  {label:<50} {bench_prompt_scan(n, where):8.3f}")


if __name__ == "__main__":
    main()

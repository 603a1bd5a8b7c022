#!/usr/bin/env python3
"""Policies on the real CPU engine (tiny models, phase draft): counts and modelled tok/s.

Runs one vLLM engine per policy on the same thinking-mode requests: fixed k=1, fixed k=2
(the controller at equal depths, so it counts per phase), the phase policy 1/2 and the adaptive
policy.  Prints verified drafts, accepted drafts, engine request-steps and tokens per phase from
the controller (which match vLLM's own counters), and tok/s under
T(k) = T0 + c_draft + d*k (the seed's cost model by default).

    python scripts/bench_policies.py [--requests 4] [--t0-ms 75 --draft-ms 3 --verify-ms 37.75]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dspark_lab.simulate import CostModel, modeled_tok_per_s
from dspark_lab import tiny_models
from dspark_lab.engine_run import run_in_subprocess
from dspark_lab.scenarios import SCRIPT, THINKING_PROMPT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4)
    CostModel.add_arguments(ap)
    args = ap.parse_args()
    cost = CostModel.from_arguments(args)
    target = str(tiny_models.build_target(SCRIPT))
    draft = str(tiny_models.build_phase_draft(SCRIPT))
    # sequential batches of one request: the adaptive estimates carry over, like a single user
    batches = [[{"prompt_ids": THINKING_PROMPT, "max_tokens": 300}] for _ in range(args.requests)]
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    adaptive = {"verify_cost_ratio": cost.verify_ms / cost.t0_ms, "draft_cost_ratio": cost.draft_ms / cost.t0_ms,
                "learn_cost": False}
    policies = {
        "fixed k=1": {"reasoning_depth": 1, "answer_depth": 1},
        "fixed k=2": {"reasoning_depth": 2, "answer_depth": 2},
        "phase 1/2": {"reasoning_depth": 1, "answer_depth": 2},
        "adaptive": {"reasoning_depth": 1, "answer_depth": 2, "policy": "adaptive", "adaptive": adaptive},
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, options) in enumerate(policies.items()):
            print(f"running engine: {name} ...", flush=True)
            report = run_in_subprocess(
                {"model": target, "speculative_config": spec, "additional_config": {"dspark_dynamic": options},
                 "batches": batches},
                Path(tmp) / str(i),
            )
            rows.append((name, report["batches"][-1]))
    plain_tps = 1000.0 / cost.t0_ms
    print(f"\ncost model: T(k) = {cost.t0_ms} + {cost.draft_ms} + {cost.verify_ms}*k ms; "
          f"no speculation = {plain_tps:.2f} tok/s")
    print(f"{'policy':<11} {'phase':<10} {'steps':>6} {'k=0 steps':>9} {'verified':>9} {'accepted':>9} "
          f"{'tokens':>7} {'model tok/s':>12}")
    for name, batch in rows:
        for phase_name, p in batch["phases"].items():
            print(f"{name:<11} {phase_name:<10} {p['steps']:>6} {p['zero_depth_steps']:>9} {p['verified']:>9} "
                  f"{p['accepted']:>9} {p['tokens']:>7} {modeled_tok_per_s({phase_name: p}, cost):>12.2f}")
        v = batch["vllm"]
        print(f"{'':<11} {'total':<10} vLLM drafts={v['vllm:spec_decode_num_drafts']} "
              f"draft_tokens={v['vllm:spec_decode_num_draft_tokens']} "
              f"accepted={v['vllm:spec_decode_num_accepted_tokens']}  "
              f"model tok/s={modeled_tok_per_s(batch['phases'], cost):.2f}")


if __name__ == "__main__":
    main()

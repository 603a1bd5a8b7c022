#!/usr/bin/env python3
"""Demo on the CPU engine: fixed-depth speculative decoding vs dspark_dynamic.

Three real vLLM engines on the tiny mock models (built locally): plain greedy decoding,
draft_model speculative decoding at a fixed k=2, and the same drafter with the dspark_dynamic
controller (1 draft while reasoning, 2 while answering).  The draft is right on ~40 % of
reasoning steps and ~90 % of answer steps, like DSpark on DeepSeek-V4.  Prints, per phase,
what vLLM verified, accepted and rejected, and a modelled tok/s for the user's box
(cost model from the seed measurements: T(k) = T0 + c_draft*[k>0] + d*k).

    python scripts/demo.py [--requests 4] [--t0-ms 75 --draft-ms 3 --verify-ms 37.75]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from dspark_dynamic.plugin import require_vllm
from dspark_dynamic.testing import tiny_models
from dspark_dynamic.testing.engine_run import run_in_subprocess
from dspark_dynamic.simulate import CostModel, modeled_tok_per_s
from dspark_dynamic.testing.scenarios import SCRIPT, THINKING_PROMPT


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=4, help="concurrent thinking-mode requests")
    CostModel.add_arguments(ap)
    ap.add_argument("--reasoning-hit", type=float, default=0.4,
                    help="fraction of reasoning transitions the draft gets right")
    ap.add_argument("--answer-hit", type=float, default=0.9,
                    help="fraction of answer transitions the draft gets right")
    args = ap.parse_args()
    print(f"vLLM {require_vllm()}; building the tiny models (cached after the first run) ...")
    target = str(tiny_models.build_target(SCRIPT))
    draft = str(tiny_models.build_phase_draft(SCRIPT, args.reasoning_hit, args.answer_hit))
    batch = [{"prompt_ids": THINKING_PROMPT, "max_tokens": 300}] * args.requests
    spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    # A fixed k=2 run with reasoning_depth=answer_depth=2 behaves exactly like plain k=2 and
    # lets the controller count per phase.
    runs = {
        "plain (no speculation)": {"model": target, "batches": [batch]},
        "fixed k=2": {"model": target, "speculative_config": spec,
                      "additional_config": {"dspark_dynamic": {"reasoning_depth": 2, "answer_depth": 2}},
                      "batches": [batch]},
        "dspark_dynamic 1/2": {"model": target, "speculative_config": spec,
                               "additional_config": {"dspark_dynamic": {"reasoning_depth": 1, "answer_depth": 2}},
                               "batches": [batch]},
    }
    cost = CostModel.from_arguments(args)
    reports = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, run_spec) in enumerate(runs.items()):
            print(f"running engine: {name} ...", flush=True)
            reports[name] = run_in_subprocess(run_spec, Path(tmp) / str(i))
    plain_out = reports["plain (no speculation)"]["batches"][0]["outputs"]
    print()
    print(f"{'run':<22} {'phase':<10} {'steps':>6} {'verified':>9} {'accepted':>9} {'rejected':>9} "
          f"{'accept%':>8} {'tokens':>7} {'model tok/s':>12}")
    for name, report in reports.items():
        b = report["batches"][0]
        same = "identical to plain" if b["outputs"] == plain_out else "DIFFERENT from plain"
        if b["phases"] is None:
            print(f"{name:<22} {'all':<10} {'':>6} {'':>9} {'':>9} {'':>9} {'':>8} "
                  f"{sum(map(len, b['outputs'])):>7} {1000.0 / args.t0_ms:>12.1f}   ({same})")
            continue
        for phase_name in ("reasoning", "answer"):
            p = b["phases"][phase_name]
            print(f"{name:<22} {phase_name:<10} {p['steps']:>6} {p['verified']:>9} {p['accepted']:>9} "
                  f"{p['verified'] - p['accepted']:>9} {100 * p['accepted'] / max(1, p['verified']):>7.1f}% "
                  f"{p['tokens']:>7} {modeled_tok_per_s({phase_name: p}, cost):>12.1f}")
        print(f"{'':<22} vLLM counters: drafts={b['vllm']['vllm:spec_decode_num_drafts']} "
              f"draft_tokens={b['vllm']['vllm:spec_decode_num_draft_tokens']} "
              f"accepted={b['vllm']['vllm:spec_decode_num_accepted_tokens']}   ({same})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

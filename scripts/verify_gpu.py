#!/usr/bin/env python3
"""One-time check on the real GPU stack (Lvllm fork or vLLM >= 0.33, DSpark, Model Runner V2).

Runs the same chat prompts (thinking mode, greedy) twice, each in its own process:
  1. ``{"method": "dspark", "num_speculative_tokens": N}``               (reference)
  2. ``{"method": "dspark_dynamic", ..., "reasoning_depth": R, "answer_depth": A}``
and reports:
  - whether the generated token ids are identical (they must be: greedy verification is lossless);
  - the CUDA-graph mode of every target forward step, by query length; any decode step that ran
    eagerly (cg_mode NONE) is a failure: the extra FULL graphs are missing;
  - per-phase depth and acceptance from the controller.

    python scripts/verify_gpu.py --model /models/DeepSeek-V4-Flash --reasoning-parser deepseek_v4 \
        [--engine-args '{"kv_cache_dtype": "fp8_ds_mla", "max_model_len": 65536}']

Exit status 0 = all checks passed, 1 = a check failed, 2 = cannot run here (no CUDA GPU / no vLLM).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile

PROMPTS = [
    "Prove that the square root of 2 is irrational.",
    "Write a Python function that merges two sorted lists, then explain its complexity.",
    "A train leaves at 9:40 and arrives at 13:05. How long is the trip? Think it through.",
]


def fail(code: int, message: str) -> None:
    print(f"verify_gpu: {message}", file=sys.stderr)
    sys.exit(code)


def check_environment() -> None:
    try:
        import torch
    except Exception as exc:  # pragma: no cover - depends on the machine
        fail(2, f"cannot run here: torch is not importable ({exc})")
    if not torch.cuda.is_available():
        fail(2, "cannot run here: no CUDA GPU is visible (torch.cuda.is_available() is False). "
                "Run this on the machine with the real GPU stack.")
    try:
        import vllm  # noqa: F401
    except Exception as exc:
        fail(2, f"cannot run here: vllm is not importable ({exc})")


def child(args: argparse.Namespace, dynamic: bool, out_path: str) -> None:
    """Runs inside a fresh process: one engine, graph modes recorded at dispatch."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # worker in this process
    from vllm import LLM, SamplingParams
    from vllm.v1.worker.gpu import cudagraph_utils as cg

    modes: collections.Counter = collections.Counter()
    original = cg.CudaGraphManager.dispatch

    def dispatch(self, num_reqs, num_tokens, uniform_token_count, *a, **kw):
        desc = original(self, num_reqs, num_tokens, uniform_token_count, *a, **kw)
        if isinstance(self, cg.ModelCudaGraphManager):
            modes[f"{desc.cg_mode.name} uniform={uniform_token_count} reqs={num_reqs}"] += 1
        return desc

    cg.CudaGraphManager.dispatch = dispatch
    spec = {"method": "dspark", "num_speculative_tokens": args.num_speculative_tokens}
    if dynamic:
        spec.update(method="dspark_dynamic", reasoning_depth=args.reasoning_depth, answer_depth=args.answer_depth,
                    log_interval_s=5)
    engine_args = json.loads(args.engine_args)
    llm = LLM(model=args.model, speculative_config=spec, reasoning_parser=args.reasoning_parser,
              disable_log_stats=False, **engine_args)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    outputs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS], params,
                       chat_template_kwargs={"thinking": True, "enable_thinking": True}, use_tqdm=False)
    phases = None
    if dynamic:
        from dspark_dynamic.adapter.patches.scheduler import latest_controller

        hook = latest_controller()
        phases = hook.controller.stats.snapshot() if hook else None
    with open(out_path, "w") as f:
        json.dump({"tokens": [list(o.outputs[0].token_ids) for o in outputs], "modes": dict(modes),
                   "phases": phases}, f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--reasoning-parser", default="deepseek_v4")
    ap.add_argument("--num-speculative-tokens", type=int, default=2)
    ap.add_argument("--reasoning-depth", type=int, default=1)
    ap.add_argument("--answer-depth", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--engine-args", default="{}", help="JSON dict of extra LLM(...) arguments")
    ap.add_argument("--child", choices=["plain", "dynamic"], help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    check_environment()
    if args.child:
        child(args, args.child == "dynamic", args.out)
        return 0
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("plain", "dynamic"):
            out = os.path.join(tmp, f"{name}.json")
            print(f"verify_gpu: running {name} dspark ...", flush=True)
            rc = subprocess.call([sys.executable, __file__, *sys.argv[1:], "--child", name, "--out", out])
            if rc != 0:
                fail(1, f"the {name} run failed (exit {rc})")
            with open(out) as f:
                results[name] = json.load(f)
    ok = True
    same = results["plain"]["tokens"] == results["dynamic"]["tokens"]
    print(f"\ngreedy outputs identical to plain dspark: {same}")
    ok &= same
    print("\ntarget forward steps by CUDA-graph mode (dspark_dynamic run):")
    for mode, count in sorted(results["dynamic"]["modes"].items()):
        print(f"  {count:6d}  {mode}")
    eager_decodes = {m: c for m, c in results["dynamic"]["modes"].items()
                     if m.startswith("NONE") and "uniform=None" not in m}
    if eager_decodes:
        print(f"FAIL: {sum(eager_decodes.values())} decode steps ran eagerly: {eager_decodes}")
        ok = False
    phases = results["dynamic"]["phases"] or {}
    print("\nper phase (dspark_dynamic run):")
    for name, p in phases.items():
        rate = 100.0 * p["accepted"] / p["verified"] if p["verified"] else 0.0
        print(f"  {name:<9} steps={p['steps']} depths={p['depth_counts']} verified={p['verified']} "
              f"accepted={p['accepted']} ({rate:.1f}%) tokens={p['tokens']}")
    print("\nRESULT:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Measured wall-clock speed of depth policies on the MoE testbed (engines side by side).

Starts one real vLLM engine per setting (fixed k = 0/1/2, phase 1/2, adaptive with default
options: the drafter's confidences gate each step, and adaptive without them), keeps them all
alive, and runs interleaved rounds of single-user thinking-mode requests; prints median tok/s
per setting and phase and the medians of paired per-round ratios with their interquartile
ranges.  A modelled figure (seed cost model) accompanies the measured one for the controlled
settings.

--context long|mixed (dspark_lab/contexts.py): prompts of at least 4,096 tokens of real text
(the environment's license texts), or short and long requests in flight together (concurrency
2: one of each; 4: two of each); max_model_len 8192, prefix caching on, every engine primed
with each document once; the default settings then add phase 0/0, adaptive (no context), the
peers vllm-av and freetoken and an A/A pair (wallclock.CONTEXT_SETTINGS).  The report's header
gives the prompt lengths per class and whether prefix caching was on.

    python scripts/bench_wallclock.py [--rounds 12 --requests 2] [--json out.json] [--plot out.png]
    python scripts/bench_wallclock.py --trace --json out.json  # with each controlled engine's trace
    python scripts/bench_wallclock.py --calibrate     # adds fixed k=3: the testbed's T(k), k = 0..3
    python scripts/bench_wallclock.py --smoke         # 2 rounds, 1 request: a quick check
    python scripts/bench_wallclock.py --shape narrow  # 32 experts x 4096, top-4 (a cheaper verify)
    python scripts/bench_wallclock.py --shape narrow-wide  # the same reads per token from 128 experts
    python scripts/bench_wallclock.py --drafter dflash  # a parallel drafter (DSpark's cost shape)
    python scripts/bench_wallclock.py --concurrency 4   # 4 requests in flight, starts staggered
    python scripts/bench_wallclock.py --epochs 4        # the rounds split over 4 sets of fresh engines
    python scripts/bench_wallclock.py --part-timers --json run.json  # then: wallclock_table.py --parts run.json
    python scripts/bench_wallclock.py --context long    # every prompt >= 4,096 tokens of real text
    python scripts/bench_wallclock.py --context mixed --concurrency 2  # one short, one long in flight
    python scripts/bench_wallclock.py --context mixed --concurrency 4 --drafter dflash --shape narrow
    python scripts/bench_wallclock.py --smoke --context mixed --concurrency 2 --settings "fixed k=0,fixed k=2,adaptive"
    python scripts/bench_wallclock.py --model smollm2 [--context short|long|mixed] ...  # a real checkpoint:
        # see dspark_lab/wallclock_real.py (--model smollm2 --help)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dspark_dynamic.adapter.plugin import require_vllm
from dspark_lab.simulate import CostModel
from dspark_lab.contexts import CONTEXTS, slot_classes
from dspark_lab.wallclock import CONTEXT_SETTINGS, DEFAULT_SETTINGS, DRAFTERS, SHAPES, format_report, run_wallclock


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--requests", type=int, default=2, help="requests per setting per round (one at a time)")
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and dropped")
    ap.add_argument("--settings", help="comma-separated (default: " + ",".join(DEFAULT_SETTINGS)
                    + "; with --context long or mixed: " + ",".join(CONTEXT_SETTINGS) + ")")
    ap.add_argument("--context", choices=CONTEXTS, default="short",
                    help="short: the script's prompt (as always); long: every prompt >= 4,096 tokens of real text; "
                         "mixed: short and long requests in flight together (needs --concurrency >= 2)")
    ap.add_argument("--calibrate", action="store_true", help="add fixed k=3 and print T(k) per step")
    ap.add_argument("--part-timers", action="store_true",
                    help="time every part of each engine step in every engine (lab/dspark_lab/part_timers.py; "
                         "per round in --json, shown by wallclock_table.py --parts)")
    ap.add_argument("--smoke", action="store_true", help="2 rounds of 1 request, no warm-up")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="default", help="the MoE target's shape")
    ap.add_argument("--drafter", choices=DRAFTERS, default="draft_model",
                    help="draft_model: sequential (a forward per position); dflash: parallel (one pass, DSpark's shape)")
    ap.add_argument("--concurrency", type=int, default=1,
                    help="requests in flight per engine (N > 1: a closed loop, starts staggered)")
    ap.add_argument("--epochs", type=int, default=1,
                    help="fresh engines this many times, the start order rotated by one place each time "
                         "(a process's speed and start position then do not ride on one setting)")
    ap.add_argument("--json", help="write the result (per-round data, summary, traces) here")
    ap.add_argument("--trace", action="store_true",
                    help="each controlled engine writes its per-step trace (into --json; costs those engines "
                         "host time every step, ~0.5%% at 4 requests); implied by --plot")
    ap.add_argument("--plot", help="write a PNG: tok/s per policy and phase, per-request timelines (traces)")
    CostModel.add_arguments(ap)
    args = ap.parse_args()
    if args.part_timers:
        os.environ["DSPARK_PART_TIMERS"] = "1"  # read by each engine process (engine_pool._worker)
    try:
        slot_classes(args.context, args.concurrency)  # mixed needs two requests in flight
    except ValueError as exc:
        ap.error(str(exc))
    if args.settings is None:
        args.settings = ",".join(DEFAULT_SETTINGS if args.context == "short" else CONTEXT_SETTINGS)
    settings = tuple(s.strip() for s in args.settings.split(",") if s.strip())
    if args.calibrate and "fixed k=3" not in settings:
        settings += ("fixed k=3",)
    if args.smoke:
        args.rounds, args.requests, args.warmup = 2, 1, 0
    print(f"vLLM {require_vllm()}; testbed: MoE target ({args.shape} shape) + {args.drafter} drafter "
          f"(built locally, cached); concurrency {args.concurrency}; context {args.context}")
    result = run_wallclock(settings, args.rounds, args.requests, args.warmup, shape=SHAPES[args.shape],
                           drafter=args.drafter, concurrency=args.concurrency, epochs=args.epochs,
                           trace=args.trace or bool(args.plot), context=args.context)
    cost = CostModel.from_arguments(args)
    print(format_report(result, cost))
    if args.calibrate:
        print("testbed step time T(k) (median ms per engine step, prefill included):")
        for name in sorted(n for n in settings if n.startswith("fixed k=")):
            print(f"  {name}: {result.step_ms(name):.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": result.settings, "shape": args.shape, "drafter": args.drafter,
                       "concurrency": args.concurrency, "epochs": args.epochs, "context": result.context,
                       "rounds": result.rounds,
                       "summary": result.summary(), "traces": result.traces}, f, indent=1)
    if args.plot:
        from dspark_lab.plots import plot_wallclock

        plot_wallclock(result.summary(), result.traces, args.plot)
        print(f"plot written to {args.plot}")
    return 0 if result.checks.get("outputs_identical_to_plain") else 1


if __name__ == "__main__":
    if any(a == "--model" or a.startswith("--model=") for a in sys.argv[1:]):  # a real checkpoint
        from dspark_lab.wallclock_real import main as main_real

        sys.exit(main_real(sys.argv[1:]))
    sys.exit(main())

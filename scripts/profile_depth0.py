#!/usr/bin/env python3
"""Where a step that verifies no draft spends its time, against plain decoding (a profiler).

Runs each setting's engine in a fresh process on the MoE testbed (in-process engine core, so
scheduler and worker share one interpreter), drives ``--concurrency`` requests at a time
through ``engine.step()`` under ``cProfile`` after a warm-up, and prints per engine step:
- the median wall time of a step, and of a step with no prefill in it;
- the functions whose own time (and cumulative time) per step differs most from the first
  setting's (plain decoding by default), grouped: the plugin's hooks, vLLM's scheduler,
  the model runner, the sampler, the drafter, the model forward.

    python scripts/profile_depth0.py [--shape narrow] [--concurrency 4] [--steps 600]
    python scripts/profile_depth0.py --settings "fixed k=0,phase 0/0,phase 1/2"

cProfile slows Python code (not the kernels) by a roughly constant factor, so the differences
between settings, not the absolute times, are what it attributes; the medians printed without
the profiler (``--no-profile``) are the wall-clock figures.  ``--timers`` measures instead with
wall-clock timers around the parts of a step (``dspark_lab.part_timers``: the
engine core, scheduler, executor, input preparation, model forward, sampling and drafting,
output update, post-step, output processing, stat loggers; the plugin's patches included in
the part they wrap, and their own time as "plugin hooks", in all and per patched part), and
prints each part's median and
mean per step (a mean above the median: a part that is dear now and then, as a drafter
catching up) against the first setting's.

    python scripts/profile_depth0.py --timers --concurrency 1 --settings "fixed k=0,phase 0/0"
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from dspark_lab.part_timers import PARTS, PATCHED, hook_times
from dspark_lab.part_timers import hooks as timed_hooks
from dspark_lab.part_timers import install as install_timers

GROUPS = (  # (label, substring of "file:function"), first match wins
    ("plugin hooks", "dspark_dynamic"),
    ("drafter", "spec_decode/"),
    ("sampler", "v1/sample/"),
    ("scheduler", "v1/core/"),
    ("model forward", "model_executor/"),
    ("model runner", "v1/worker/"),
    ("engine", "v1/engine/"),
    ("torch", "torch/"),
)


def child(args: argparse.Namespace) -> None:
    """One setting's engine: run, profile, write ``{steps, step_ms, decode_ms}`` and the stats."""
    import cProfile
    import time

    from dspark_lab.engine_run import engine_env

    for key, value in engine_env().items():
        os.environ.setdefault(key, value)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from dspark_lab.testbed import TESTBED_SCRIPT, prompt_ids
    from dspark_lab.wallclock import SHAPES, engine_specs

    spec = engine_specs((args.setting,), None, SHAPES[args.shape], args.drafter)[args.setting]
    kwargs = dict(model=spec["model"], dtype="bfloat16", max_model_len=512, enforce_eager=True,
                  disable_log_stats=False, distributed_executor_backend="uni", seed=0)
    for key in ("speculative_config", "additional_config"):
        if spec.get(key):
            kwargs[key] = spec[key]
    parts = install_timers() if args.timers else None  # before the engine binds its step
    engine = LLM(**kwargs).llm_engine
    prompt = TokensPrompt(prompt_token_ids=prompt_ids(TESTBED_SCRIPT, thinking=True))
    params = SamplingParams(temperature=0.0, max_tokens=len(TESTBED_SCRIPT.expected_output()) + 10)
    stagger = len(TESTBED_SCRIPT.expected_output()) // args.concurrency
    count = 0

    def add() -> None:
        nonlocal count
        count += 1
        engine.add_request(f"p-{count}", prompt, params)

    profiler = cProfile.Profile()
    times, decode = [], []
    for i in range(args.warmup + args.steps):
        live = engine.get_num_unfinished_requests()
        if live < args.concurrency and (live == 0 or i % max(1, stagger) == 0):
            add()
        prefill = engine.get_num_unfinished_requests() > live
        if i == args.warmup and args.profile:
            profiler.enable()
        if parts is not None:
            parts.clear()
        t = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t
        if i >= args.warmup:
            times.append(dt)
            if not prefill:
                decode.append(dt)
                if parts is not None:
                    for name in PARTS:
                        per_part.setdefault(name, []).append(parts.get(name, 0.0))
                    per_part.setdefault("plugin hooks", []).append(timed_hooks(parts))
                    for name, seconds in hook_times(parts).items():
                        per_part.setdefault(f"  hook: {name}", []).append(seconds)
    profiler.disable()
    if args.profile:
        profiler.dump_stats(args.out + ".prof")
    result = {"steps": len(times), "step_ms": 1e3 * statistics.median(times),
              "decode_ms": 1e3 * statistics.median(decode) if decode else None,
              "mean_ms": 1e3 * statistics.fmean(times)}
    if per_part:
        result["parts"] = {name: [1e3 * statistics.median(v), 1e3 * statistics.fmean(v)] for name, v in per_part.items()}
        result["parts"]["decode step"] = [result["decode_ms"], 1e3 * statistics.fmean(decode)]
    Path(args.out).write_text(json.dumps(result))


per_part: dict[str, list[float]] = {}


def group_of(key: tuple[str, int, str]) -> str:
    where = f"{key[0]}:{key[2]}"
    for label, needle in GROUPS:
        if needle in where:
            return label
    return "other"


def per_step(path: str, steps: int) -> dict[tuple[str, int, str], tuple[float, float]]:
    """function -> (own seconds, cumulative seconds) per step."""
    stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
    return {key: (tt / steps, ct / steps) for key, (_cc, _nc, tt, ct, _callers) in stats.items()}


def print_parts(settings: list[str], results: dict) -> None:
    """Per part of a decode step: median and mean ms per setting, and each setting less the first."""
    ref = results[settings[0]]["parts"]
    print("\nms per decode step, median / mean (the first setting's, then each other's less it)")
    print(f"{'part':<30}" + "".join(f"{name:>26}" for name in settings))
    for part in [*PARTS, "plugin hooks", *(f"  hook: {name}" for name in PATCHED), "decode step"]:
        if part not in ref:
            continue
        cells = []
        for i, name in enumerate(settings):
            med, mean = results[name]["parts"][part]
            if i:
                med, mean = med - ref[part][0], mean - ref[part][1]
            cells.append(f"{med:+9.3f} / {mean:+8.3f}" if i else f"{med:9.3f} / {mean:8.3f}")
        print(f"{part:<30}" + "".join(f"{c:>26}" for c in cells))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default="fixed k=0,phase 0/0", help="comma-separated; the first is the reference")
    ap.add_argument("--shape", default="narrow")
    ap.add_argument("--drafter", default="draft_model")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--timers", action="store_true", help="wall-clock timers around a step's parts (no cProfile)")
    ap.add_argument("--setting", help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.setting:
        child(args)
        return 0
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if len(set(settings)) < len(settings):
        ap.error("--settings: each setting once (results are kept by name)")
    tmp = tempfile.mkdtemp(prefix="profile-depth0-")
    results = {}
    for i, name in enumerate(settings):
        out = os.path.join(tmp, f"{i}.json")
        cmd = [sys.executable, __file__, "--setting", name, "--out", out, "--shape", args.shape,
               "--drafter", args.drafter, "--concurrency", str(args.concurrency), "--steps", str(args.steps),
               "--warmup", str(args.warmup)] + ([] if args.profile and not args.timers else ["--no-profile"])
        cmd += ["--timers"] if args.timers else []
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results[name] = json.loads(Path(out).read_text())
        r = results[name]
        print(f"{name:<14} median step {r['step_ms']:.2f} ms, decode-only {r['decode_ms']:.2f} ms, "
              f"mean {r['mean_ms']:.2f} ms over {r['steps']} steps" + (" (under cProfile)" if args.profile and not args.timers else ""))
    if args.timers:
        print_parts(settings, results)
        return 0
    if not args.profile:
        return 0
    ref_name = settings[0]
    ref = per_step(os.path.join(tmp, "0.json.prof"), results[ref_name]["steps"])
    for i, name in enumerate(settings[1:], start=1):
        other = per_step(os.path.join(tmp, f"{i}.json.prof"), results[name]["steps"])
        groups: dict[str, float] = {}
        for key in set(ref) | set(other):
            d = other.get(key, (0.0, 0.0))[0] - ref.get(key, (0.0, 0.0))[0]
            groups[group_of(key)] = groups.get(group_of(key), 0.0) + d
        print(f"\n{name} - {ref_name}: own time per step by group (ms, under cProfile)")
        for label, d in sorted(groups.items(), key=lambda kv: -abs(kv[1])):
            print(f"  {label:<14} {1e3 * d:+8.3f}")
        diffs = []
        for key in set(ref) | set(other):
            a, b = ref.get(key, (0.0, 0.0)), other.get(key, (0.0, 0.0))
            diffs.append((b[0] - a[0], b[1] - a[1], key))
        print("functions by own-time difference per step (ms): own, cumulative")
        for d_own, d_cum, key in sorted(diffs, key=lambda t: -abs(t[0]))[: args.top]:
            where = f"{Path(key[0]).parent.name}/{Path(key[0]).name}:{key[1]} {key[2]}"
            print(f"  {1e3 * d_own:+8.3f} {1e3 * d_cum:+8.3f}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Linear step-cost features against a per-shape table, on recorded engine steps.

Reads the controller's step rows (``{"step_s", "verified_tokens", "reqs", "draft_depth",
"decode_only"}``) from ``bench_wallclock.py --trace --json`` results (every controlled setting's trace)
or from ``trace_path`` JSONL files, and replays them in order through both cost models,
predicting each decode step *before* learning it (prequential): ``core.costs.StepCost`` (the
policy's: linear in what the step carries, a posterior, forgetting, clipped residuals) and
``dspark_lab.shape_table.ShapeTable`` (a mean per step shape, as the peers tabulate by tokens verified;
an unseen shape reads the nearest seen one).  Prints, per model, the median and mean absolute
relative error over all steps, over steps whose shape had been seen fewer than 5 times (a probe,
a new batch size: where a decision needs a price it has not measured), and how often the
linear model's 90 % predictive interval held the step.

    python scripts/cost_models.py RESULT.json [RESULT.json ...] [--no-catch-up]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from dspark_dynamic.core import costs
from dspark_dynamic.core.costs import Shape, StepCost, features
from dspark_lab.shape_table import ShapeTable

RARE = 5  # a shape seen fewer times than this before a step is "rare" for it


def step_rows(path: str) -> dict[str, list[dict]]:
    """name -> the decode-step rows of each recorded engine, in order."""
    text = Path(path).read_text()
    if path.endswith(".json"):
        traces = json.loads(text).get("traces", {})
    else:
        traces = {Path(path).stem: text}
    out = {}
    for name, body in traces.items():
        rows = [json.loads(line) for line in body.splitlines() if line.strip()]
        steps = [r for r in rows if "step_s" in r and r.get("decode_only", True) and r.get("reqs", 0) > 0]
        if steps:
            out[f"{Path(path).stem}:{name}"] = steps
    return out


def replay(steps: list[dict], catches_up: bool) -> dict[str, list[float]]:
    linear, table = StepCost(), ShapeTable()
    seen: dict[Shape, int] = {}
    errs: dict[str, list[float]] = {"linear": [], "table": [], "linear rare": [], "table rare": [], "covered": []}
    last = -1
    for row in steps:
        d = max(int(row.get("draft_depth", 0)), 0)
        shape = Shape(int(row["reqs"]), int(row["verified_tokens"]), d, catches_up and d > 0 and last == 0)
        last = d
        t = float(row["step_s"])
        if linear.known:
            x = features(shape)
            pred = linear.predict_one(x) * linear.speed  # at the machine's speed as of the last step
            fallback = pred
            tab = table.predict_one(shape, fallback)
            rare = seen.get(shape, 0) < RARE
            for name, p in (("linear", pred), ("table", tab)):
                e = abs(p - t) / t
                errs[name].append(e)
                if rare:
                    errs[f"{name} rare"].append(e)
            sd = linear.speed * math.sqrt(linear.noise + sum(linear.sd(i) ** 2 * v * v for i, v in enumerate(x)))
            errs["covered"].append(1.0 if abs(t - pred) <= 1.645 * sd else 0.0)
        linear.learn_one(shape, t)
        table.learn_one(shape, t)
        seen[shape] = seen.get(shape, 0) + 1
    return errs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--no-catch-up", dest="catch_up", action="store_false",
                    help="the drafter was not skipped while idle (no 'resumed' steps)")
    args = ap.parse_args()
    total: dict[str, list[float]] = {}
    for path in args.paths:
        for name, steps in step_rows(path).items():
            errs = replay(steps, args.catch_up)
            for key, values in errs.items():
                total.setdefault(key, []).extend(values)
            if errs["linear"]:
                print(f"{name}: {len(steps)} steps; median error linear {statistics.median(errs['linear']):.3f}, "
                      f"table {statistics.median(errs['table']):.3f}")
    if not total.get("linear"):
        print("no decode steps found (a bench_wallclock.py result holds traces only when run with --trace)")
        return 1
    print(f"\nall engines ({len(total['linear'])} predicted steps; {len(total['linear rare'])} of a rare shape):")
    for model in ("linear", "table"):
        for key in (model, f"{model} rare"):
            v = total.get(key) or [math.nan]
            print(f"  {key:<12} median |error| {statistics.median(v):.3f}, mean {statistics.fmean(v):.3f}")
    print(f"  linear model's 90 % predictive interval held {statistics.fmean(total['covered']):.1%} of the steps "
          f"(memory {costs.MEMORY:.0f} steps)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

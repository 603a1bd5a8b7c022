#!/usr/bin/env python3
"""Markdown tables from ``bench_wallclock.py --json`` results: one row per run, each setting's
median of paired per-round ratios against plain decoding (``fixed k=0``), with its IQR.

    python scripts/wallclock_table.py run1.json run2.json ...          # ratios to plain
    python scripts/wallclock_table.py --against adaptive run.json ...  # ratios of adaptive to each
    python scripts/wallclock_table.py --plot ratios.png run1.json ...    # and draw them (matplotlib)
    python scripts/wallclock_table.py --parts run.json                 # ms per step by part of a step

Paired: each round's tok/s of a setting over the same round's plain (or, with ``--against``, the
named setting over each other one), so the round-to-round swings of a shared machine cancel.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from dspark_lab.paired import paired_ratio
from dspark_lab.part_timers import PARTS, hooks

PLAIN = "fixed k=0"


def tok_per_s(round_: dict, name: str) -> float | None:
    row = round_.get(name)
    if not row:
        return None
    seconds = sum(row["seconds"].values())
    return sum(row["tokens"].values()) / seconds if seconds > 0 else None


def paired(rounds: list[dict], num: str, den: str) -> tuple[float, float, float] | None:
    """(median, q1, q3) of the per-round ratios ``num / den`` (``dspark_lab.paired``, as the benchmark)."""
    pairs = [(a, b) for a, b in ((tok_per_s(r, num), tok_per_s(r, den)) for r in rounds) if a and b]
    if len(pairs) < 2:
        return None
    s = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
    return s.median, s.q1, s.q3


def label(run: dict) -> str:
    return f"{run['shape']}, {run['drafter']}, concurrency {run['concurrency']}, {len(run['rounds'])} rounds"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="bench_wallclock.py --json files")
    ap.add_argument("--against", help="ratios of this setting to each other one (default: each to plain)")
    ap.add_argument("--plot", help="write a PNG of the table: one panel per run, a bar per setting")
    ap.add_argument("--parts", action="store_true",
                    help="per part of an engine step (a run of bench_wallclock.py --part-timers): ms per step")
    args = ap.parse_args(argv)
    runs = [json.load(open(p)) for p in args.runs]
    if args.parts:
        for run in runs:
            print_parts(run)
        return 0
    names: list[str] = []
    for run in runs:
        names += [n for n in run["settings"] if n not in names and n != (args.against or PLAIN)]
    head = "÷ plain" if not args.against else f"{args.against} ÷"
    print(f"| run ({head}) | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    table = []
    for run in runs:
        cells, row = [], {}
        for n in names:
            if n not in run["settings"]:
                cells.append("")
                continue
            r = paired(run["rounds"], args.against, n) if args.against else paired(run["rounds"], n, PLAIN)
            cells.append(f"{r[0]:.3f} ({r[1]:.2f}-{r[2]:.2f})" if r else "")
            if r:
                row[n] = r
        print(f"| {label(run)} | " + " | ".join(cells) + " |")
        table.append((label(run), row))
    if args.plot:
        plot(table, head, args.plot)
    return 0


def print_parts(run: dict) -> None:
    """Per part: plain's median ms per step over the rounds, then each setting's paired median
    difference to plain (ms per step; each round's part seconds over its steps)."""
    rounds = [r for r in run["rounds"] if all("parts" in m for m in r.values())]
    if not rounds:
        print(f"{label(run)}: no part timings (run bench_wallclock.py with --part-timers)")
        return
    names = [PLAIN] + [n for n in run["settings"] if n != PLAIN]
    seen = {p for r in rounds for m in r.values() for p in m["parts"]}
    parts = [p for p in [*PARTS, *(f"{n} (vLLM)" for n in PARTS), "engine step"] if p in seen]

    def per_step(m: dict, part: str) -> float:
        if part == "outside engine core":
            seconds = m["parts"].get("engine step", 0.0) - m["parts"].get("engine core", 0.0)
        elif part == "plugin hooks":
            seconds = hooks(m["parts"])
        else:
            seconds = m["parts"].get(part, 0.0)
        return 1e3 * seconds / max(1, m["steps"])

    print(f"{label(run)}: ms per engine step (plain's median; each other setting's median paired difference)")
    print(f"| part | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for part in parts + ["outside engine core", "plugin hooks"]:
        cells = [f"{statistics.median(per_step(r[PLAIN], part) for r in rounds):.3f}"]
        for n in names[1:]:
            d = statistics.median(per_step(r[n], part) - per_step(r[PLAIN], part) for r in rounds)
            cells.append(f"{d:+.3f}")
        print(f"| {part} | {' | '.join(cells)} |")


def plot(table: list[tuple[str, dict[str, tuple[float, float, float]]]], head: str, path: str) -> None:
    """One panel per run: each setting's paired median as a bar, its IQR as an error bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(table), 1, figsize=(11, 2.6 * len(table)), squeeze=False)
    for ax, (title, row) in zip(axes[:, 0], table):
        names = list(row)
        med = [row[n][0] for n in names]
        err = [[m - row[n][1] for n, m in zip(names, med)], [row[n][2] - m for n, m in zip(names, med)]]
        colors = ["tab:red" if n.startswith("adaptive") else "tab:gray" if n.startswith("fixed")
                  else "tab:blue" if n.startswith("phase") else "tab:green" for n in names]  # green: the peers
        ax.bar(range(len(names)), med, yerr=err, color=colors, capsize=3)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
        ax.set_ylim(min(0.6, min(med) - 0.05), max(1.25, max(med) + 0.05))
        ax.set_title(f"{title} ({head}, median of paired per-round ratios, IQR)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())

"""Pictures of a wall-clock benchmark (matplotlib, a dependency of the laboratory).

- ``tok/s per policy and phase``: median tok/s (bars) with interquartile ranges (whiskers);
- ``timeline``: one request of a controlled engine from its ``trace_path`` rows: per decode step,
  the phase (background), the chosen depth and the drafts accepted;
- ``reliability``: for a policy gating on draft confidences, per phase, the observed acceptance
  against the predicted one in probability bins (dot size: labels); on the diagonal = calibrated.
"""

from __future__ import annotations

import json
from typing import Any


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # the laboratory's dependency, never the plugin's
        raise SystemExit(
            "dspark_dynamic: --plot needs matplotlib (pip install matplotlib)"
        ) from exc
    return plt


def request_timeline(trace_text: str, request_index: int = -1) -> list[dict[str, Any]]:
    """The request-step rows (phase, k, accepted) of one request of a controller trace."""
    by_req: dict[str, list[dict[str, Any]]] = {}
    for line in trace_text.splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        if "phase" in row:
            by_req.setdefault(str(row.get("req", "")), []).append(row)
    if not by_req:
        return []
    return list(by_req.values())[request_index]


def confidence_reports(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """setting -> phase -> calibration report dict, from a wall-clock summary's checks."""
    suffix = ": confidence"
    return {k[: -len(suffix)]: v for k, v in summary.get("checks", {}).items() if k.endswith(suffix) and v}


def plot_reliability(ax: Any, reports: dict[str, dict[str, Any]]) -> None:
    from dspark_dynamic.core.confidence import CalibrationReport

    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="calibrated")
    for name, phases in reports.items():
        for phase, data in phases.items():
            points = CalibrationReport.from_dict(data).reliability()
            if not points:
                continue
            xs, ys, ns = zip(*points)
            total = sum(ns)
            ax.plot(xs, ys, marker="o", lw=1, label=f"{name} [{phase}]")
            ax.scatter(xs, ys, s=[400 * n / total for n in ns], alpha=0.3)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("predicted P(draft accepted)")
    ax.set_ylabel("observed")
    ax.set_title("Draft-confidence reliability (per phase; dot size: labels)")
    ax.legend(loc="upper left", fontsize="small")


def plot_wallclock(summary: dict[str, Any], traces: dict[str, str], path: str) -> None:
    """Write a PNG: tok/s per policy and phase, one timeline per controlled policy, and the
    reliability diagram of the policies that gate on draft confidences."""
    plt = _pyplot()
    timelines = {name: request_timeline(text) for name, text in traces.items()}
    timelines = {k: v for k, v in timelines.items() if v}
    reports = confidence_reports(summary)
    rows = 1 + len(timelines) + (1 if reports else 0)
    fig, axes = plt.subplots(rows, 1, figsize=(10, 3.6 + 2.4 * (rows - 1)),
                             gridspec_kw={"height_ratios": [1.5] + [1] * (rows - 1)})
    axes = list(axes) if rows > 1 else [axes]
    if reports:
        plot_reliability(axes.pop(), reports)
    ax = axes[0]
    names = list(summary["tok_per_s"])
    groups = ("all", "reasoning", "answer")
    width = 0.8 / len(groups)
    for g, group in enumerate(groups):
        med = [summary["tok_per_s"][n][group]["median"] for n in names]
        lo = [m - summary["tok_per_s"][n][group]["q1"] for n, m in zip(names, med)]
        hi = [summary["tok_per_s"][n][group]["q3"] - m for n, m in zip(names, med)]
        xs = [i + (g - 1) * width for i in range(len(names))]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=group)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("tok/s (median, IQR)")
    ax.set_title("Measured wall-clock tok/s per policy and phase (engines side by side)")
    ax.legend()
    colors = {"reasoning": "#f3e0c0", "answer": "#d0e8d0"}
    for ax, (name, rows) in zip(axes[1:], timelines.items()):
        steps = range(len(rows))
        for i, row in enumerate(rows):
            ax.axvspan(i - 0.5, i + 0.5, color=colors.get(row["phase"], "white"), lw=0)
        ax.step(steps, [r["k"] for r in rows], where="mid", color="black", label="depth chosen")
        ax.bar(steps, [r["accepted"] for r in rows], width=0.6, color="tab:blue", alpha=0.6, label="drafts accepted")
        ax.set_ylabel("drafts")
        ax.set_title(f"{name}: one request, per decode step (tan = reasoning, green = answer)")
        ax.legend(loc="upper left")
    if timelines:
        axes[-1].set_xlabel("decode step")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

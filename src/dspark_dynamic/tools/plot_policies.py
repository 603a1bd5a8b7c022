"""The figure of ``dspark-dynamic-bench --policies --plot FILE.png``.

Left: each arm's tok/s, one point per round, with its median as a bar.  Right: each non-reference
arm's paired ratio to the reference (median, IQR as error bars) for overall, reasoning and answer
tok/s, the A/A band shaded and 1.0 drawn.  matplotlib is imported inside ``plot_policies`` and is
never a dependency of the plugin: without it the figure is skipped with one line.
"""

from __future__ import annotations

from typing import Any

METRICS = (("overall", "o"), ("reasoning", "s"), ("answer", "^"))


def plot_policies(result: dict[str, Any], path: str) -> str:
    """Write the figure of a ``bench_policies`` result to ``path``; a line saying what was done."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return f"matplotlib is not installed: --plot {path} skipped"
    labels = [a["label"] for a in result["arms"]]
    fig = Figure(figsize=(5 + 1.6 * len(labels), 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for i, label in enumerate(labels):
        values = [r["tok_per_s"] for r in result["rows"] if r["arm"] == label and r["tok_per_s"] is not None]
        offsets = [i + 0.25 * ((k % 5) - 2) / 2 for k in range(len(values))]
        left.plot(offsets, values, "o", alpha=0.6, color=f"C{i % 10}")
        median = result["summary"]["arms"][label]["overall"]
        if median is not None:
            left.hlines(median["median"], i - 0.3, i + 0.3, color="black")
    left.set_xticks(range(len(labels)), labels, rotation=30, ha="right")
    left.set_ylabel("tok/s per round (bar: median)")
    mixed = ", policies mixed" if result["mix"] else ""
    left.set_title(f"{result['rounds']} rounds, concurrency {result['concurrency']}{mixed}")

    ratios = result["summary"]["ratios"]
    names = list(ratios)
    aa = result["summary"]["aa"]
    if aa is not None and aa["overall"] is not None:
        right.axhspan(aa["overall"]["q1"], aa["overall"]["q3"], color="grey", alpha=0.25, label="A/A IQR")
    right.axhline(1.0, color="black", linewidth=0.8)
    for j, (metric, marker) in enumerate(METRICS):
        xs, ys, lows, highs = [], [], [], []
        for i, name in enumerate(names):
            s = ratios[name][metric]
            if s is not None:
                xs.append(i + (j - 1) * 0.2)
                ys.append(s["median"])
                lows.append(s["median"] - s["q1"])
                highs.append(s["q3"] - s["median"])
        if xs:
            right.errorbar(xs, ys, yerr=[lows, highs], fmt=marker, capsize=3, label=metric)
    right.set_xticks(range(len(names)), names, rotation=30, ha="right")
    right.set_ylabel(f"paired ratio to {result['reference']} (median, IQR)")
    right.legend(fontsize="small")
    fig.savefig(path, dpi=110)
    return f"plot written to {path}"

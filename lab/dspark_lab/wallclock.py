"""Wall-clock comparison of depth policies on the MoE testbed (engines side by side).

Settings (each a live vLLM engine on the testbed target, ``draft_model`` drafter):

- ``fixed k=0``  no speculation;
- ``fixed k=1``  / ``fixed k=2`` / ``fixed k=3``: plain vLLM with ``num_speculative_tokens = k``
  (no plugin options: what a user could run without us);
- ``phase 1/2``: N = 2 and the phase policy (1 draft while reasoning, 2 while answering);
  any ``phase R/A`` works (``phase 2/2`` is fixed k = 2 with per-phase counts), and
  ``phase R/A unbounded`` turns the draft bound off (the drafter always drafts N);
- ``adaptive``: N = 2 and ``policy: adaptive`` with default options (costs learned online; the
  drafter's own confidences gate each step);
- ``adaptive (no confidence)``: the same with ``adaptive.confidence`` off (acceptance estimates
  only), for comparison;
- ``adaptive (no context)``: the same with ``adaptive.context_features`` off (one price per
  verified draft, whatever its request's context), for comparison on long and mixed contexts;
- ``vllm-av``, ``freetoken``, ``break-even``, ``p-min``: the peers' rules (``core/peers.py``) on
  the same drafter, N = 2.

``shape``: the MoE target's shape (``MoEShape``; ``narrow`` = 32 experts x 4096, top-4, where a
step at depth 0/1/2 costs about 8 / 13 / 18 ms; ``narrow-wide``: the same reads per token from
128 experts, 805 MB of weights, more than this VM's 300 MB last-level cache holds).
``drafter``: ``draft_model`` (the sequential tiny Llama phase draft on the Mixtral testbed: one
drafter forward per drafted position) or
``dflash`` (the hand-set parallel drafter, ``dspark_lab.parallel_drafter``, on the same cost shape
as a Qwen3-MoE, which has the aux hidden states DFlash reads: one forward drafts every
position, DSpark's cost shape); every setting, k = 0 included, runs on that drafter's target.

``context`` (``dspark_lab.contexts``): ``short`` (the script's prompt, as always), ``long``
(every prompt holds a document of at least 4,096 tokens of license text), ``mixed`` (short and
long requests in flight together; concurrency 2 or more).  Long and mixed runs give every engine
``max_model_len`` 8192, prefix caching on and long-position copies of the models, prime each
engine with every document once (its prefill then stays out of the rounds), and default to
``CONTEXT_SETTINGS`` (peers and an A/A pair included); the script's output is the same whatever
the document, so the exactness check holds as for short prompts.

Every round runs ``requests`` thinking-mode requests on every setting, one request at a time:
one request per setting in a rotated order, ``requests`` times, so a slow spell of the shared
machine hits every setting alike; the first ``warmup`` rounds are dropped.  Claims are medians of paired per-round
ratios (``dspark_lab.paired``).  Greedy outputs must equal the script, and the controller's
per-phase counts must equal vLLM's counters; both are checked and reported.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dspark_dynamic.core.options import PEER_POLICIES
from dspark_lab import contexts
from dspark_lab.paired import paired_ratio, rotation, summarize
from dspark_lab.engine_pool import BALLAST, SMALL_KV_CACHE, EnginePool
from dspark_lab.progress import ratios_so_far, track
from dspark_lab.testbed import TESTBED_SCRIPT, MoEShape, build_moe_target, build_testbed_draft, prompt_ids
from dspark_lab.wallclock_report import format_report, modeled  # noqa: F401  (the report, re-exported)

PHASES = ("reasoning", "answer")
DEFAULT_SETTINGS = ("fixed k=0", "fixed k=1", "fixed k=2", "phase 1/2", "adaptive", "adaptive (no confidence)")
# Long and mixed contexts: the fixed depths, the depth-0 floor through the plugin, the phase
# policy, adaptive with and without its context features, the peers named by issue #50 (vLLM's
# adaptive verification with its one-context profile, FreeToken's per-width step times), and an
# A/A pair (what the run cannot resolve).
CONTEXT_SETTINGS = ("fixed k=0", "fixed k=1", "fixed k=2", "phase 0/0", "phase 1/2", "adaptive",
                    "adaptive (no context)", "vllm-av", "freetoken", "fixed k=0 (copy)")
SHAPES = {
    "default": MoEShape(),
    "narrow": MoEShape(experts=32, intermediate=4096, top_k=4),
    # narrow's reads per token from four times the experts (805 MB of weights, like default's):
    # a target too large for the host's last-level cache, as the seed box's experts in DDR5 are
    "narrow-wide": MoEShape(experts=128, intermediate=4096, top_k=4),
}
# The claims the benchmark prints: (numerator, denominator); "best of k=1|phase" is resolved to
# whichever of the two has the higher median tok/s.
CLAIMS = (
    ("adaptive", "best of fixed k=0|fixed k=1|fixed k=2|phase 1/2"),
    ("adaptive (no confidence)", "best of fixed k=0|fixed k=1|fixed k=2|phase 1/2"),
    ("adaptive", "adaptive (no context)"),
    ("adaptive (no context)", "best of fixed k=0|fixed k=1|fixed k=2|phase 1/2"),
    ("phase 0/0", "fixed k=0"),
    *(("adaptive", peer) for peer in PEER_POLICIES),
    ("phase 1/2", "fixed k=2"),
    ("phase 1/2", "fixed k=1"),
    ("adaptive", "phase 1/2"),
    ("adaptive", "best of fixed k=1|phase 1/2"),
    ("adaptive", "phase 0/2"),  # the best fixed depth per phase on the testbeds (0 reasoning, 2 answer)
    ("phase 0/2", "phase 1/2"),
    ("adaptive", "fixed k=2"),
    ("adaptive", "fixed k=0"),
    ("adaptive", "adaptive (no confidence)"),
    ("adaptive (no confidence)", "phase 1/2"),
    ("phase 1/2", "phase 1/2 unbounded"),
    ("fixed k=1", "fixed k=0"),
)


COPY = " (copy)"  # "<setting> (copy)", "<setting> (copy 2)", ...: the same setting in another engine; its ratio to the
# first measures what the benchmark cannot resolve (engine placement, memory layout, noise)


def base_setting(name: str) -> str:
    """The setting a copy runs (``"fixed k=0 (copy 2)"`` -> ``"fixed k=0"``)."""
    return re.sub(r" \(copy(?: \d+)?\)$", "", name)


def controlled(name: str) -> bool:
    name = base_setting(name)
    return name.startswith("phase ") or name.startswith("adaptive") or name in PEER_POLICIES


def trace_file(trace_dir: Path, name: str) -> Path:
    return trace_dir / f"{name.replace(' ', '_').replace('/', '-')}.jsonl"


DRAFTERS = ("draft_model", "dflash")


def testbed_models(shape: MoEShape, drafter: str) -> tuple[str, dict[str, Any]]:
    """(target path, speculative_config for N drafts without num_speculative_tokens)."""
    if drafter == "dflash":
        from dspark_lab.parallel_drafter import DraftDesign, build_dflash_drafter, build_qwen3_moe_target
        from dspark_lab.testbed import ANSWER_HIT, DRAFT_SEED, REASONING_HIT

        design = DraftDesign(reasoning_hit=REASONING_HIT, answer_hit=ANSWER_HIT, seed=DRAFT_SEED)
        draft = build_dflash_drafter(TESTBED_SCRIPT, design)
        return str(build_qwen3_moe_target(TESTBED_SCRIPT, shape)), {"method": "dflash", "model": str(draft)}
    if drafter != "draft_model":
        raise ValueError(f"unknown drafter {drafter!r}; one of {DRAFTERS}")
    return str(build_moe_target(shape=shape)), {"method": "draft_model", "model": str(build_testbed_draft())}


def engine_specs(names: tuple[str, ...], trace_dir: Path | None, shape: MoEShape = MoEShape(),
                 drafter: str = "draft_model", context: str = "short") -> dict[str, dict[str, Any]]:
    """Each setting's engine arguments; a controlled engine writes its trace into ``trace_dir``
    (None: no trace, as a user runs it; a trace costs the controlled engines host time).
    ``context`` long or mixed: ``contexts.ENGINE`` (max_model_len, prefix caching on) and the
    models' long-position copies."""
    target, drafting = testbed_models(shape, drafter)
    engine = dict(SMALL_KV_CACHE["engine"])
    if context != "short":
        target = str(contexts.long_context_copy(target))
        drafting = {**drafting, "model": str(contexts.long_context_copy(drafting["model"]))}
        engine.update(contexts.ENGINE)
    specs: dict[str, dict[str, Any]] = {}
    for full_name in names:
        name = base_setting(full_name)  # another engine of the same setting (A/A check)
        spec: dict[str, Any] = {"model": target, **SMALL_KV_CACHE, "engine": dict(engine)}
        if name.startswith("fixed k="):
            k = int(name.split("=")[1])
            if k:
                spec["speculative_config"] = {**drafting, "num_speculative_tokens": k}
        else:
            options: dict[str, Any] = {}
            if trace_dir is not None:
                options["trace_path"] = str(trace_file(trace_dir, full_name))
            if name.startswith("phase "):
                reasoning, answer = (int(x) for x in name.split()[1].split("/"))
                options.update(reasoning_depth=reasoning, answer_depth=answer)
                if name.endswith(" unbounded"):  # the drafter drafts N whatever is verified
                    options.update(bound_drafts=False)
            elif name == "adaptive":
                options.update(policy="adaptive")
            elif name == "adaptive (no confidence)":
                options.update(policy="adaptive", adaptive={"confidence": False})
            elif name == "adaptive (no context)":
                options.update(policy="adaptive", adaptive={"context_features": False})
            elif name in PEER_POLICIES:
                options.update(policy=name)
            else:
                raise ValueError(f"unknown setting {name!r}")
            spec["speculative_config"] = {**drafting, "num_speculative_tokens": 2}
            spec["additional_config"] = {"dspark_dynamic": options}
        specs[full_name] = spec
    return specs


PER_SLOT = 2  # at concurrency N, a turn runs this many requests per slot (N in flight)


@dataclass
class WallclockResult:
    settings: list[str]
    concurrency: int = 1
    rounds: list[dict[str, dict[str, Any]]] = field(default_factory=list)  # per round: setting -> measures
    checks: dict[str, Any] = field(default_factory=dict)
    traces: dict[str, str] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)  # long/mixed: classes, prompt lengths, prefix caching

    def tok_per_s(self, name: str, phase: str | None = None) -> list[float]:
        out = []
        for rnd in self.rounds:
            m = rnd[name]
            tokens = m["tokens"][phase] if phase else sum(m["tokens"].values())
            seconds = m["seconds"][phase] if phase else sum(m["seconds"].values())
            out.append(tokens / seconds if seconds else 0.0)
        return out

    def step_ms(self, name: str) -> float:
        """Median per-round busy milliseconds per engine step (decode and prefill together)."""
        return summarize([1000.0 * sum(r[name]["seconds"].values()) / max(1, r[name]["steps"])
                          for r in self.rounds]).median

    def claim(self, a: str, b: str) -> tuple[str, Any]:
        if b.startswith("best of "):
            options = b[len("best of "):].split("|")
            if not all(o in self.settings for o in options) or a not in self.settings:
                return b, None
            b = max(options, key=lambda o: summarize(self.tok_per_s(o)).median)
        if a not in self.settings or b not in self.settings:
            return b, None
        return b, paired_ratio(self.tok_per_s(a), self.tok_per_s(b))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tok_per_s": {}, "ratios": {}, "checks": self.checks}
        for name in self.settings:
            out["tok_per_s"][name] = {
                "all": summarize(self.tok_per_s(name)).as_dict(),
                **{p: summarize(self.tok_per_s(name, p)).as_dict() for p in PHASES},
            }
        copies = tuple((n, base_setting(n)) for n in self.settings if base_setting(n) != n)
        for a, b in CLAIMS + copies:
            resolved, ratio = self.claim(a, b)
            if ratio is not None:
                name = f"{a} / {b} = {resolved}" if b.startswith("best of ") else f"{a} / {resolved}"
                out["ratios"][name] = ratio.as_dict()
        return out


def start_order(settings: tuple[str, ...], epoch: int) -> tuple[str, ...]:
    """The order the engines of ``epoch`` start in: the settings rotated by ``epoch`` places
    (a Latin square over N epochs: no setting always starts first, last or in the middle)."""
    shift = epoch % len(settings) if settings else 0
    return tuple(settings[shift:]) + tuple(settings[:shift])


def run_wallclock(settings: tuple[str, ...] = DEFAULT_SETTINGS, rounds: int = 12, requests: int = 2,
                  warmup: int = 1, log: Any = print, trace_dir: Path | None = None,
                  shape: MoEShape = MoEShape(), drafter: str = "draft_model", concurrency: int = 1,
                  epochs: int = 1, trace: bool = False, context: str = "short") -> WallclockResult:
    """Start every setting's engine, then run interleaved rounds; returns the measured result.

    ``concurrency`` 1: each of a round's ``requests`` turns runs one request per setting.  N > 1:
    each turn runs ``PER_SLOT * N`` requests per setting in a closed loop with N in flight, the
    first N started a ``1/N`` of a request's length apart (so steps mix reasoning and answering
    requests).

    ``epochs`` E > 1: the rounds are split over E sets of fresh engines, each with its own
    ``warmup`` rounds, started in the order ``start_order`` gives (every setting takes every
    place once in each N epochs of N settings); a process's speed and its place in the start
    order then change from epoch to epoch instead of riding on one setting for the whole run.
    The checks add up the epochs' counts.

    ``trace`` (or a ``trace_dir``): every controlled engine writes its per-step trace
    (``trace_path``), returned in ``traces``; off by default, since writing it costs the
    controlled engines, and only them, host time in every step (about 0.5 % at four requests in
    flight on the narrow shape).

    ``context`` (``dspark_lab.contexts``): ``short`` as above; ``long`` or ``mixed``: each slot of
    the closed loop runs prompts of its class (``slot_classes``, ``slot_queues``) from a fixed
    set of documents, every engine first primed with each prompt once (prefix caching on: the
    rounds then find each document's prefill cached); ``result.context`` says the classes, the
    prompt lengths, whether prefix caching was on and how much of the rounds' prompts it found."""
    if epochs < 1 or epochs > rounds:
        raise ValueError(f"epochs must be in 1..rounds ({rounds}); got {epochs}")
    classes = contexts.slot_classes(context, concurrency)  # refuses mixed at concurrency 1
    prompts = None if context == "short" else contexts.testbed_prompts(TESTBED_SCRIPT, classes)
    tmp = None
    if trace and trace_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="wallclock-")
        trace_dir = Path(tmp.name)
    result = WallclockResult(list(settings), concurrency=concurrency)
    if prompts is not None:
        contexts.check_fits(prompts, len(TESTBED_SCRIPT.expected_output(thinking=True)) + 10)
        result.context = {"context": context, "classes": list(classes), "prompt_tokens": contexts.lengths(prompts)}
        log(f"context {context}: prompt tokens (min/median/max) {result.context['prompt_tokens']}")
    wrong: dict[str, int] = {}
    try:
        played = 0  # rounds run so far, warm-up included (the rotation carries on across epochs)
        for epoch in range(epochs):
            order = start_order(settings, epoch)
            measured = rounds // epochs + (1 if epoch < rounds % epochs else 0)
            where = f" (epoch {epoch + 1}/{epochs})" if epochs > 1 else ""
            log(f"starting {len(order)} engines side by side{where}: {', '.join(order)} ...")
            with EnginePool(engine_specs(order, trace_dir, shape, drafter, context), ballast=BALLAST) as pool:
                primed = None
                if prompts is not None:
                    result.context["prefix_caching"] = contexts.prefix_caching_line(pool.info)
                    primed = contexts.prime(pool, settings, prompts, log)
                played = _run_rounds(pool, result, wrong, warmup, measured, requests, concurrency, played, log,
                                     (classes, prompts) if prompts is not None else None)
                _add_checks(pool, result)
                if primed is not None:
                    contexts.add_prefix_hits(pool, settings, primed, result.context)
        result.checks["outputs_identical_to_plain"] = not wrong
        result.checks["wrong_outputs"] = wrong
        for name in settings:
            if trace_dir is not None and controlled(name):
                path = trace_file(trace_dir, name)
                if path.exists():
                    result.traces[name] = path.read_text()
    finally:
        if tmp is not None:
            tmp.cleanup()
    return result


def _run_rounds(pool: EnginePool, result: WallclockResult, wrong: dict[str, int], warmup: int, rounds: int,
                requests: int, concurrency: int, played: int, log: Any,
                workload: tuple[tuple[str, ...], dict[str, list[list[int]]]] | None = None) -> int:
    """``warmup`` dropped rounds, then ``rounds`` measured ones, appended to ``result``; returns
    the rounds played in all so far (``played`` before).  ``workload`` (slot classes, prompts per
    class): a long or mixed context, each turn's slot queues from ``contexts.slot_queues``."""
    settings = result.settings
    end_id = TESTBED_SCRIPT.vocab()["</think>"]
    expected = TESTBED_SCRIPT.expected_output(thinking=True)
    prompt = prompt_ids(TESTBED_SCRIPT, thinking=True)
    max_tokens = len(expected) + 10
    per_turn = 1 if concurrency <= 1 else PER_SLOT * concurrency
    stagger = len(expected) // max(1, concurrency) if concurrency > 1 else 0
    for r in track(range(warmup + rounds), "wall-clock rounds", "round", status=lambda: ratios_so_far(result)):
        measures = {name: {"tokens": {p: 0 for p in PHASES}, "seconds": {p: 0.0 for p in PHASES}, "steps": 0}
                    for name in settings}
        for rep in range(requests):  # one request per setting at a time, order rotated
            turn = (played + r) * requests + rep
            queues = None
            if workload is not None:  # every setting gets the same prompts in a turn
                queues = contexts.slot_queues(*workload, turn, per_turn // len(workload[0]))
            for name in rotation(list(settings), turn):
                timing = pool.run(name, prompt, max_tokens, end_id, requests=per_turn,
                                  concurrency=concurrency, stagger=stagger, slots=queues)
                bad = sum(1 for out in timing.outputs if out != expected)
                if bad or len(timing.outputs) != per_turn:
                    wrong[name] = wrong.get(name, 0) + max(bad, 1)
                m = measures[name]
                for p in PHASES:
                    m["tokens"][p] += timing.tokens[p]
                    m["seconds"][p] += timing.seconds[p]
                m["steps"] += timing.steps
                if timing.parts:  # bench_wallclock.py --part-timers
                    parts = m.setdefault("parts", {})
                    for part, seconds in timing.parts.items():
                        parts[part] = parts.get(part, 0.0) + seconds
        if r >= warmup:
            result.rounds.append(measures)
            line = "  ".join(f"{n} {sum(m['tokens'].values()) / sum(m['seconds'].values()):.1f}"
                             for n, m in measures.items())
            log(f"round {len(result.rounds)}: tok/s {line}")
    return played + warmup + rounds


def _add_checks(pool: EnginePool, result: WallclockResult) -> None:
    """The controlled engines' per-phase counts against vLLM's, added to those of earlier epochs
    (the confidence report and the live estimate: the latest epoch's)."""
    checks = result.checks
    for name in result.settings:
        if not controlled(name):
            continue
        c = pool.counters(name)
        phases, v = c["phases"], c["vllm"]
        ours = [sum(p[key] for p in phases.values()) for key in ("steps", "verified", "accepted")]
        theirs = [v["vllm:spec_decode_num_drafts"], v["vllm:spec_decode_num_draft_tokens"],
                  v["vllm:spec_decode_num_accepted_tokens"]]
        counts_key = f"{name}: counts (steps, verified, accepted) ours / vLLM"
        equal_key = f"{name}: counts equal vLLM's"
        checks[equal_key] = checks.get(equal_key, True) and ours == theirs
        checks[counts_key] = _added(checks.get(counts_key), [ours, theirs])
        checks[f"{name}: phases"] = _added(checks.get(f"{name}: phases"), phases)
        if c.get("confidence"):
            checks[f"{name}: confidence"] = c["confidence"]
        if c.get("estimate"):  # the live estimate at the end of the run
            checks[f"{name}: estimate"] = c["estimate"]


def _added(a: Any, b: Any) -> Any:
    """``b`` added to ``a`` key by key and item by item (numbers summed; ``a`` None: ``b``)."""
    if a is None:
        return b
    if isinstance(b, dict):
        return {k: _added(a.get(k), v) for k, v in b.items()} | {k: v for k, v in a.items() if k not in b}
    if isinstance(b, list):
        return [_added(a[i] if i < len(a) else None, b[i]) if i < len(b) else a[i] for i in range(max(len(a), len(b)))]
    return a + b

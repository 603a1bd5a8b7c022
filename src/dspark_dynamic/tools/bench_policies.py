"""Paired comparison of depth policies on one server: ``dspark-dynamic-bench --policies``.

Each policy spec becomes per-request extra args (``vllm_xargs`` in the chat-completions body):

- ``fixed K`` (alias ``depth K``) -> ``{"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": K}``;
- ``phase R/A`` -> ``{"dspark_dynamic_policy": "phase", "dspark_dynamic_reasoning_depth": R,
  "dspark_dynamic_answer_depth": A}``;
- a bare word (``adaptive``, a peer rule's name) -> ``{"dspark_dynamic_policy": WORD}``: the server
  runs that policy itself, and answers HTTP 400 if its configured policy differs;
- ``server`` -> no ``vllm_xargs``: the server's configured policy.

A spec's label (``fixed K``, ``phase R/A``, the word, ``server``) is also the ``policy`` label of the
server's ``dspark_dynamic:policy_*`` series.  Each spec is one arm; the A/A spec (default: the
reference) runs as a second arm, labelled ``<label> (A/A)``, with the same extra args.

Invariants of a run: in every round every arm sends the same requests (all prompts, each
``--repetitions`` times, in the same order); round ``r`` runs the arms in the listed order rotated
to start at arm ``r mod n``; without ``--mix`` one arm's requests run at a time (``--concurrency``
of them in flight), so policies never share a decode step; with ``--mix`` a round's requests of
all arms go out together, interleaved, ``--concurrency`` per arm in flight, so they do.  An arm's
tok/s in a round is its completion tokens over the wall time of its requests (with ``--mix``:
over the sum of its requests' own times, a per-request rate).  A ratio is the median over rounds
of arm/reference in the same round, with inclusive quartiles; the A/A ratio is the noise band.
Where the server publishes its live estimate, ``live_check`` sets it beside the measured ratio.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from dspark_dynamic.tools import bench_client as bc
from dspark_dynamic.tools import live_check
from dspark_dynamic.tools.paired import Summary, rotation, summarize

BenchError = bc.BenchError
METRICS = ("overall", *bc.PHASES)
VERIFIED = "dspark_dynamic:policy_verified_draft_tokens_total"
ACCEPTED = "dspark_dynamic:policy_accepted_draft_tokens_total"
AA_SUFFIX = " (A/A)"
LINE = 119  # the progress line is cut here, so that it never wraps on a usual terminal
_NUMBER = re.compile(r"^\d+$")
_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]*$")
_NEEDS_ARGUMENT = ("fixed", "depth", "phase")


@dataclass(frozen=True)
class PolicySpec:
    """One policy as requested: ``kind`` is ``fixed``, ``phase``, ``named`` or ``server``."""

    kind: str
    depth: int = 0
    reasoning_depth: int = 0
    answer_depth: int = 0
    name: str = ""

    @property
    def label(self) -> str:
        if self.kind == "fixed":
            return f"fixed {self.depth}"
        if self.kind == "phase":
            return f"phase {self.reasoning_depth}/{self.answer_depth}"
        return self.name if self.kind == "named" else "server"

    def xargs(self) -> dict[str, str | int] | None:
        """The request's ``vllm_xargs`` (flat values), or None to send none."""
        if self.kind == "fixed":
            return {"dspark_dynamic_policy": "fixed", "dspark_dynamic_depth": self.depth}
        if self.kind == "phase":
            return {"dspark_dynamic_policy": "phase", "dspark_dynamic_reasoning_depth": self.reasoning_depth,
                    "dspark_dynamic_answer_depth": self.answer_depth}
        if self.kind == "named":
            return {"dspark_dynamic_policy": self.name}
        return None


@dataclass(frozen=True)
class Arm:
    label: str
    spec: PolicySpec


def parse_spec(text: str) -> PolicySpec:
    """``fixed K`` / ``depth K`` / ``phase R/A`` / a policy name / ``server``; else a BenchError."""
    words = text.split()
    bad = BenchError(f"bad policy spec {text.strip()!r}: expected 'fixed K', 'depth K', 'phase R/A', "
                     f"a policy name such as 'adaptive', or 'server'")
    if len(words) == 2 and words[0].lower() in ("fixed", "depth") and _NUMBER.match(words[1]):
        return PolicySpec("fixed", depth=int(words[1]))
    if len(words) == 2 and words[0].lower() == "phase":
        reasoning, slash, answer = words[1].partition("/")
        if slash and _NUMBER.match(reasoning) and _NUMBER.match(answer):
            return PolicySpec("phase", reasoning_depth=int(reasoning), answer_depth=int(answer))
    if len(words) == 1 and words[0].lower() == "server":
        return PolicySpec("server")
    if len(words) == 1 and _WORD.match(words[0]) and words[0].lower() not in _NEEDS_ARGUMENT:
        return PolicySpec("named", name=words[0])
    raise bad


def build_arms(policies: str, reference: str | None = None, aa: str | None = None,
               with_aa: bool = True) -> tuple[list[Arm], str, str | None]:
    """The arms in listed order (a reference or A/A spec not listed is appended), the reference's
    label, and the A/A copy's label (None without an A/A pair)."""
    specs: list[PolicySpec] = []
    for piece in policies.split(","):
        if not piece.strip():
            raise BenchError(f"empty policy spec in --policies {policies!r}")
        spec = parse_spec(piece)
        if spec.label in (s.label for s in specs):
            raise BenchError(f"policy {spec.label!r} is listed twice in --policies (use --aa for an A/A pair)")
        specs.append(spec)
    ref = parse_spec(reference) if reference is not None else specs[0]
    twin = parse_spec(aa) if aa is not None else ref
    for extra in (ref, twin if with_aa else None):
        if extra is not None and extra not in specs:
            specs.append(extra)
    arms = [Arm(s.label, s) for s in specs]
    aa_label = None
    if with_aa:
        aa_label = twin.label + AA_SUFFIX
        arms.append(Arm(aa_label, twin))
    return arms, ref.label, aa_label


def paired(values: Sequence[float | None], reference: Sequence[float | None]) -> Summary | None:
    """Median and IQR of ``values[r] / reference[r]`` over the rounds where both were measured."""
    ratios = [v / r for v, r in zip(values, reference, strict=True) if v is not None and r]
    return summarize(ratios) if ratios else None


def median_of(values: Sequence[float | None]) -> Summary | None:
    kept = [v for v in values if v is not None]
    return summarize(kept) if kept else None


def _as_dict(s: Summary | None) -> dict[str, float] | None:
    return s.as_dict() if s is not None else None


def per_round(rows: list[dict[str, Any]], label: str, metric: str) -> list[float | None]:
    """One arm's tok/s (``overall`` or a phase) for each round present in ``rows``, in round order;
    None for a round the arm has no row in, so that two arms' lists pair round by round."""
    mine = {r["round"]: r["tok_per_s"] if metric == "overall" else r["phases"][metric]["tok_per_s"]
            for r in rows if r["arm"] == label}
    return [mine.get(n) for n in sorted({r["round"] for r in rows})]


def summarize_rows(rows: list[dict[str, Any]], labels: Sequence[str], reference: str,
                   aa_label: str | None) -> dict[str, Any]:
    """Per-arm medians, paired ratios to the reference, and the A/A ratio (copy over original)."""
    series = {lab: {m: per_round(rows, lab, m) for m in METRICS} for lab in labels}
    out: dict[str, Any] = {
        "arms": {lab: {m: _as_dict(median_of(series[lab][m])) for m in METRICS} for lab in labels},
        "ratios": {}, "aa": None,
    }
    aa = None
    if aa_label is not None:
        original = aa_label[: -len(AA_SUFFIX)]
        aa = {m: paired(series[aa_label][m], series[original][m]) for m in METRICS}
        out["aa"] = {m: _as_dict(s) for m, s in aa.items()}
    for lab in labels:
        if lab in (reference, aa_label):
            continue
        ratios = {m: paired(series[lab][m], series[reference][m]) for m in METRICS}
        entry: dict[str, Any] = {m: _as_dict(s) for m, s in ratios.items()}
        band, mine = (aa or {}).get("overall"), ratios["overall"]
        entry["beyond_aa"] = None if band is None or mine is None else (mine.q3 < band.q1 or mine.q1 > band.q3)
        out["ratios"][lab] = entry
    return out


def policy_acceptance(before: dict | None, after: dict | None) -> dict[str, dict[str, dict[str, Any]]] | None:
    """Acceptance per ``policy`` and ``phase`` label over the run (engines summed), or None when the
    server has no ``dspark_dynamic:policy_*`` series."""
    if before is None or after is None:
        return None
    keys = {(dict(lab).get("policy"), dict(lab).get("phase")) for name, lab in after if name in (VERIFIED, ACCEPTED)}
    keys = {k for k in keys if k[0] is not None and k[1] is not None}
    if not keys:
        return None
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for policy, phase in sorted(keys):
        verified, accepted = (bc._sum(after, name, policy=policy, phase=phase)
                              - bc._sum(before, name, policy=policy, phase=phase) for name in (VERIFIED, ACCEPTED))
        out.setdefault(policy, {})[phase] = {"verified": verified, "accepted": accepted,
                                             "acceptance": accepted / verified if verified else None}
    return out


def _arms_first(acceptance: dict[str, Any] | None, labels: Sequence[str]) -> dict[str, Any] | None:
    """The acceptance table with the arms' policies first, in arm order."""
    if acceptance is None:
        return None
    order = [lab for lab in dict.fromkeys(labels) if lab in acceptance]
    return {lab: acceptance[lab] for lab in order + sorted(set(acceptance) - set(order))}


def measure(results: list[bc.RequestResult], seconds: float) -> dict[str, Any]:
    """One arm's numbers in one round: ``seconds`` is the time its tok/s divides by."""
    tokens = sum(r.completion_tokens if r.completion_tokens is not None else sum(r.tokens.values())
                 for r in results)
    phases = {}
    for phase in bc.PHASES:
        n = sum(r.tokens[phase] for r in results)
        s = sum(r.seconds[phase] for r in results)
        phases[phase] = {"tokens": n, "seconds": s, "tok_per_s": n / s if s > 0 and n else None}
    return {"requests": len(results), "completion_tokens": tokens, "seconds": seconds,
            "tok_per_s": tokens / seconds if seconds > 0 else None, "phases": phases,
            "approximate_tokens": any(r.approximate_tokens for r in results)}


def run_requests(base: str, jobs: list[tuple[str, dict[str, Any]]], in_flight: int,
                 timeout: float) -> list[bc.RequestResult]:
    """Stream every ``(label, body)`` job, ``in_flight`` at a time, in list order; the results in
    job order.  The first failure stops the rest and is raised, prefixed with its job's label."""
    results: list[bc.RequestResult | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not pending or errors:
                    return
                i = pending.pop(0)
            label, body = jobs[i]
            try:
                results[i] = bc.stream_chat(base, body, timeout)
            except BenchError as exc:
                with lock:
                    errors.append(f"{label}: {exc}")
                return

    threads = [threading.Thread(target=worker) for _ in range(max(1, min(in_flight, len(jobs))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise BenchError(errors[0])
    return [r for r in results if r is not None]


class Progress:
    """One ``\\r``-rewritten line on a stream (stderr); silent when disabled."""

    def __init__(self, enabled: bool, stream: TextIO | None = None) -> None:
        self.enabled, self.stream, self.width = enabled, stream or sys.stderr, 0

    def show(self, text: str) -> None:
        if self.enabled:
            text = text[:LINE]
            self.stream.write("\r" + text.ljust(self.width))
            self.stream.flush()
            self.width = len(text)

    def close(self) -> None:
        if self.enabled and self.width:
            self.stream.write("\n")
            self.stream.flush()


def _running(rows: list[dict[str, Any]], labels: Sequence[str], reference: str, aa_label: str | None) -> str:
    """The running medians of the first two ratios to the reference and of the A/A ratio."""
    if not rows:
        return ""
    summary = summarize_rows(rows, labels, reference, aa_label)
    shown = [f"{lab} {r['overall']['median']:.3f}" for lab, r in summary["ratios"].items() if r["overall"]][:2]
    if summary["aa"] and summary["aa"]["overall"]:
        shown.append(f"A/A {summary['aa']['overall']['median']:.3f}")
    return f"| ratio to {reference}: " + ", ".join(shown) if shown else ""


def run(args: argparse.Namespace, progress: Progress | None = None) -> dict[str, Any]:
    arms, reference, aa_label = build_arms(args.policies, args.reference, args.aa, not args.no_aa)
    rounds = 5 if args.rounds is None else args.rounds
    if rounds < 1 or args.concurrency < 1 or args.repetitions < 1:
        raise BenchError("--rounds, --concurrency and --repetitions must be at least 1")
    progress = progress or Progress(False)
    base = args.base_url.rstrip("/")
    model = args.model or bc.fetch_models(base, args.timeout)[0]
    listed = bc.load_prompts(args.prompts)
    prompts = [p for _ in range(args.repetitions) for p in listed]
    settings = argparse.Namespace(**vars(args))
    settings.temperature = 0.0 if args.temperature is None else args.temperature
    plain = args.plain_url.rstrip("/") if args.plain_url else None
    plain_model = (args.model or bc.fetch_models(plain, args.timeout)[0]) if plain else None

    def body(arm: Arm | None, prompt: str) -> dict[str, Any]:
        out = bc.request_body(settings, plain_model if arm is None else model, prompt)
        xargs = arm.spec.xargs() if arm is not None else None
        if xargs is not None:
            out["vllm_xargs"] = dict(xargs)
        return out

    metrics_url = args.metrics_url or base + "/metrics"
    before = bc.scrape_metrics(metrics_url, args.timeout)
    labels = [a.label for a in arms]
    rows: list[dict[str, Any]] = []
    plain_rows: list[dict[str, Any]] = []
    orders: list[list[str]] = []
    for r in range(rounds):
        order = rotation(arms, r)
        orders.append([a.label for a in order])
        status = _running(rows, labels, reference, aa_label)
        if args.mix:
            progress.show(f"round {r + 1}/{rounds}: {len(order)} arms mixed  {status}")
            jobs = [(arm.label, body(arm, p)) for p in prompts for arm in order]
            results = run_requests(base, jobs, args.concurrency * len(order), args.timeout)
            for slot, arm in enumerate(order):
                own = [res for (lab, _), res in zip(jobs, results, strict=True) if lab == arm.label]
                rows.append({"round": r, "slot": slot, "arm": arm.label,
                             **measure(own, sum(x.total_s for x in own))})
        else:
            for slot, arm in enumerate(order):
                progress.show(f"round {r + 1}/{rounds} arm {slot + 1}/{len(order)} {arm.label}  {status}")
                start = time.perf_counter()
                results = run_requests(base, [(arm.label, body(arm, p)) for p in prompts], args.concurrency,
                                       args.timeout)
                rows.append({"round": r, "slot": slot, "arm": arm.label,
                             **measure(results, time.perf_counter() - start)})
        if plain:
            progress.show(f"round {r + 1}/{rounds} plain server  {status}")
            start = time.perf_counter()
            results = run_requests(plain, [("plain server", body(None, p)) for p in prompts], args.concurrency,
                                   args.timeout)
            plain_rows.append({"round": r, **measure(results, time.perf_counter() - start)})
    progress.show(f"{rounds}/{rounds} rounds done  {_running(rows, labels, reference, aa_label)}")
    progress.close()
    after = bc.scrape_metrics(metrics_url, args.timeout)
    summary = summarize_rows(rows, labels, reference, aa_label)
    result: dict[str, Any] = {
        "mode": "policies", "base_url": base, "model": model, "rounds": rounds, "concurrency": args.concurrency,
        "mix": bool(args.mix), "temperature": settings.temperature, "requests_per_arm": len(prompts),
        "prompts": listed, "repetitions": args.repetitions,
        "rate": "per-request (tokens / sum of the arm's request times)" if args.mix
                else "tokens / wall time of the arm's requests",
        "arms": [{"label": a.label, "policy_label": a.spec.label, "vllm_xargs": a.spec.xargs()} for a in arms],
        "reference": reference, "aa": aa_label, "order": orders, "rows": rows, "summary": summary,
        "acceptance": _arms_first(policy_acceptance(before, after), [a.spec.label for a in arms]),
        "metrics_available": after is not None, "plain": None,
        "live_estimate": live_check.cross_check(after, arms, rows, aa_label),
    }
    if plain:
        plain_median = median_of([p["tok_per_s"] for p in plain_rows])
        ratios: dict[str, float | None] = {}
        for lab in labels:
            mine = summary["arms"][lab]["overall"]
            ok = mine is not None and plain_median is not None and plain_median.median > 0
            ratios[lab] = mine["median"] / plain_median.median if ok else None
        result["plain"] = {"base_url": plain, "model": plain_model, "schedule": "one pass at the end of each round",
                           "rows": plain_rows, "tok_per_s": _as_dict(plain_median), "ratio_of_medians": ratios}
    return result


def _fmt(s: dict[str, float] | None, iqr: bool = False) -> str:
    if s is None:
        return "-"
    return f"{s['median']:.3f} [{s['q1']:.3f}-{s['q3']:.3f}]" if iqr else f"{s['median']:.2f}"


def print_report(res: dict[str, Any], out: TextIO | None = None) -> None:
    def say(line: str = "") -> None:
        print(line, file=out or sys.stdout)

    conc = res["concurrency"]
    say(f"policies on {res['model']} at {res['base_url']}: {res['rounds']} rounds; every arm sends the same "
        f"{res['requests_per_arm']} requests per round (prompts x repetitions), temperature {res['temperature']:g}")
    if res["mix"]:
        say(f"--mix: a round's requests of all arms go out together, interleaved, {conc} per arm in flight: policies "
            f"share decode steps; an arm's tok/s is per request (its tokens / the sum of its requests' times)")
    else:
        shared = ": an arm's own requests share decode steps; policies do not mix (--mix mixes them)"
        say(f"arms run one at a time, order rotated per round; concurrency {conc}" + (shared if conc > 1 else ""))
    say()
    width = max(len(a["label"]) for a in res["arms"]) + len(" (reference)") + 1
    say(f"{'arm':<{width}} {'tok/s':>9} {'reasoning':>10} {'answer':>9}   median over rounds")
    for arm in res["arms"]:
        lab = arm["label"]
        name = lab + (" (reference)" if lab == res["reference"] else "")
        a = res["summary"]["arms"][lab]
        say(f"{name:<{width}} {_fmt(a['overall']):>9} {_fmt(a['reasoning']):>10} {_fmt(a['answer']):>9}")
    say()
    say(f"ratio to {res['reference']}: median of per-round ratios [IQR]")
    say(f"{'arm':<{width}} {'tok/s':>21} {'reasoning':>21} {'answer':>21}  beyond A/A")
    for lab, r in res["summary"]["ratios"].items():
        beyond = {True: "yes", False: "no", None: "-"}[r["beyond_aa"]]
        say(f"{lab:<{width}} {_fmt(r['overall'], True):>21} {_fmt(r['reasoning'], True):>21} "
            f"{_fmt(r['answer'], True):>21}  {beyond}")
    aa = res["summary"]["aa"]
    if aa is not None:
        say(f"A/A {res['aa']} / {res['aa'][: -len(AA_SUFFIX)]}: {_fmt(aa['overall'], True)} (reasoning "
            f"{_fmt(aa['reasoning'], True)}, answer {_fmt(aa['answer'], True)}): a ratio whose IQR overlaps "
            f"this band is no measured difference.")
    say()
    acc = res["acceptance"]
    if acc is None:
        why = "no usable /metrics" if not res["metrics_available"] else "no dspark_dynamic:policy_* series"
        say(f"acceptance per policy not shown: {why} on the server")
    else:
        say("acceptance per policy and phase over the whole run (server /metrics; an A/A pair shares its policy's row)")
        say(f"{'policy':<{width}} {'phase':<10} {'verified':>9} {'accepted':>9} {'accept%':>8}")
        for policy, phases in acc.items():
            for phase, v in phases.items():
                rate = f"{100 * v['acceptance']:.1f}%" if v["acceptance"] is not None else "-"
                say(f"{policy:<{width}} {phase:<10} {v['verified']:>9.0f} {v['accepted']:>9.0f} {rate:>8}")
    for line in live_check.report_lines(res.get("live_estimate"), res["metrics_available"]):
        say(line)
    plain = res["plain"]
    if plain is not None:
        say()
        say(f"plain server {plain['base_url']} ({plain['schedule']}): median tok/s {_fmt(plain['tok_per_s'])}")
        say("  " + ", ".join(f"{lab} {v:.3f}" if v is not None else f"{lab} -"
                             for lab, v in plain["ratio_of_medians"].items()) + "  (arm median / plain median)")
        say("  caveat: unpaired (different servers): these ratios are only as good as the box is quiet")
    if any(r["approximate_tokens"] for r in res["rows"]):
        say("token counts approximate (one token per chunk): the server sent no token_ids")


def main(args: argparse.Namespace) -> int:
    """Run the paired mode for parsed arguments; exit status 0, or 2 with a one-line error."""
    to_stdout = args.json == "-"
    progress = Progress(not to_stdout and (args.progress or sys.stderr.isatty()))
    try:
        result = run(args, progress)
    except BenchError as exc:
        progress.close()
        print(f"dspark-dynamic-bench: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as exc:
        progress.close()
        print(f"dspark-dynamic-bench: error: bad input or response: {exc}", file=sys.stderr)
        return 2
    if to_stdout:
        json.dump(result, sys.stdout, indent=1)
        print()
    else:
        print_report(result)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    if args.plot:
        from dspark_dynamic.tools.plot_policies import plot_policies

        print(plot_policies(result, args.plot), file=sys.stderr if to_stdout else sys.stdout)
    return 0

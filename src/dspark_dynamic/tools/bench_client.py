"""Phase-split benchmark client for any OpenAI-compatible chat server.

Streams chat completions, attributes every streamed chunk to the reasoning phase (a
``reasoning`` / ``reasoning_content`` delta) or the answer phase (a ``content`` delta), and
prints per-phase tokens, time and tok/s, plus TTFT.  A chunk's time is the gap since the
previous chunk of the same request (the first chunk's gap is the TTFT and belongs to no phase).
Token counts come from ``token_ids`` in the chunks (vLLM's ``return_token_ids``); without them,
from the ``logprobs`` entries, else one token per chunk (an approximation, flagged in the output).

When the server exposes ``/metrics``, the client scrapes it before and after the run and adds
the per-phase acceptance from ``dspark_dynamic:*`` series and vLLM's own spec-decode counters.
With ``--policies`` it compares policies on one server instead (``bench_policies``).

    dspark-dynamic-bench --base-url http://127.0.0.1:8000 --concurrency 2 --repetitions 3

Errors (server down, malformed responses, no /metrics) are reported in one line, never as a
traceback; exit status 2 for a failed run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_PROMPTS = [
    "How many prime numbers are there between 1 and 50? Check your count.",
    "Explain why the sky is blue, then summarise it in one sentence.",
    "Write a Python function that reverses a linked list and explain it.",
]
PHASES = ("reasoning", "answer")


class BenchError(Exception):
    """A problem the user can act on; printed as one line."""


@dataclass
class RequestResult:
    ttft_s: float = 0.0
    total_s: float = 0.0
    tokens: dict[str, int] = field(default_factory=lambda: {p: 0 for p in PHASES})
    seconds: dict[str, float] = field(default_factory=lambda: {p: 0.0 for p in PHASES})
    approximate_tokens: bool = False
    completion_tokens: int | None = None


def _chunk_tokens(choice: dict[str, Any]) -> tuple[int, bool]:
    """Tokens in one streamed choice, and whether the count is exact."""
    if isinstance(choice.get("token_ids"), list):
        return len(choice["token_ids"]), True
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        return len(logprobs["content"]), True
    return 1, False


def _phase_of(delta: dict[str, Any]) -> str | None:
    if delta.get("reasoning") or delta.get("reasoning_content"):
        return "reasoning"
    if delta.get("content"):
        return "answer"
    return None


def parse_sse_line(line: bytes) -> dict[str, Any] | None:
    """One ``data: {...}`` line -> its JSON object; None for keep-alives and ``[DONE]``."""
    text = line.decode("utf-8", errors="replace").strip()
    if not text or text.startswith(":") or not text.startswith("data:"):
        return None
    payload = text[len("data:"):].strip()
    if payload == "[DONE]":
        return None
    try:
        obj = json.loads(payload)
    except ValueError as exc:
        raise BenchError(f"malformed stream chunk (not JSON): {payload[:120]!r}") from exc
    if not isinstance(obj, dict):
        raise BenchError(f"malformed stream chunk (not an object): {payload[:120]!r}")
    if "error" in obj:
        raise BenchError(f"server error in stream: {json.dumps(obj['error'])[:300]}")
    return obj


def stream_chat(base_url: str, body: dict[str, Any], timeout: float) -> RequestResult:
    url = urllib.parse.urlsplit(base_url)
    conn_cls = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    path = (url.path.rstrip("/") or "") + "/v1/chat/completions"
    result = RequestResult()
    start = time.perf_counter()
    last = start
    first = True
    current: str | None = None
    try:
        conn = conn_cls(url.hostname, url.port, timeout=timeout)
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise BenchError(f"POST {path} returned HTTP {resp.status}: {resp.read()[:300]!r}")
        while True:
            line = resp.readline()
            if not line:
                break
            obj = parse_sse_line(line)
            if obj is None:
                continue
            if isinstance(obj.get("usage"), dict):
                result.completion_tokens = obj["usage"].get("completion_tokens")
            choices = obj.get("choices")
            if not isinstance(choices, list):
                raise BenchError(f"malformed stream chunk (no 'choices' list): {json.dumps(obj)[:160]}")
            for choice in choices:
                if not isinstance(choice, dict) or not isinstance(choice.get("delta", {}), dict):
                    raise BenchError(f"malformed choice in stream: {json.dumps(choice)[:160]}")
                phase = _phase_of(choice.get("delta") or {})
                n, exact = _chunk_tokens(choice)
                now = time.perf_counter()
                if phase is None and "token_ids" not in choice:
                    continue  # role header, keep-alive or usage-only chunk
                phase = phase or current or "answer"  # e.g. the </think> or EOS token alone
                current = phase
                if first:
                    result.ttft_s = now - start
                    first = False
                else:
                    result.seconds[phase] += now - last
                result.tokens[phase] += n
                result.approximate_tokens |= not exact
                last = now
        conn.close()
    except BenchError:
        raise
    except (OSError, http.client.HTTPException) as exc:
        raise BenchError(f"cannot reach the server at {base_url}: {exc}") from exc
    result.total_s = time.perf_counter() - start
    return result


def fetch_models(base_url: str, timeout: float) -> list[str]:
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=timeout) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot reach the server at {base_url} (/v1/models): {exc}") from exc
    try:
        return [m["id"] for m in data["data"]]
    except (KeyError, TypeError) as exc:
        raise BenchError(f"malformed /v1/models response: {str(data)[:200]}") from exc


def scrape_metrics(metrics_url: str, timeout: float) -> dict[tuple[str, tuple], float] | None:
    """Samples of the metrics we use, or None when the server has no usable /metrics."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", errors="replace")
    except (OSError, ValueError):
        return None
    try:
        from prometheus_client.parser import text_string_to_metric_families

        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith(("dspark_dynamic:", "vllm:spec_decode_", "vllm:num_requests_running")):
                    samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return samples
    except Exception:
        return None


def _sum(samples: dict, name: str, **labels: str) -> float:
    return sum(
        v for (n, lab), v in samples.items()
        if n == name and all(dict(lab).get(k) == val for k, val in labels.items())
    )


def metrics_delta(before: dict | None, after: dict | None) -> dict[str, Any] | None:
    if before is None or after is None:
        return None

    def d(name: str, **labels: str) -> float:
        return _sum(after, name, **labels) - _sum(before, name, **labels)

    out: dict[str, Any] = {
        "vllm": {
            "drafts": d("vllm:spec_decode_num_drafts_total"),
            "draft_tokens": d("vllm:spec_decode_num_draft_tokens_total"),
            "accepted_tokens": d("vllm:spec_decode_num_accepted_tokens_total"),
        },
        "phases": {},
    }
    for phase in PHASES:
        verified = d("dspark_dynamic:verified_draft_tokens_total", phase=phase)
        accepted = d("dspark_dynamic:accepted_draft_tokens_total", phase=phase)
        out["phases"][phase] = {
            "steps": d("dspark_dynamic:steps_total", phase=phase),
            "verified": verified,
            "accepted": accepted,
            "acceptance": accepted / verified if verified else None,
            "tokens": d("dspark_dynamic:generated_tokens_total", phase=phase),
        }
    out["has_phase_series"] = any(n.startswith("dspark_dynamic:") for n, _ in after)
    return out


def load_prompts(path: str | None) -> list[str]:
    """The prompts of ``--prompts`` (a JSON list, or one per line), or the built-in ones."""
    if not path:
        return list(DEFAULT_PROMPTS)
    try:
        with open(path) as f:
            text = f.read()
    except OSError as exc:
        raise BenchError(f"cannot read prompts file {path}: {exc}") from exc
    return json.loads(text) if text.lstrip().startswith("[") else [line for line in text.splitlines() if line.strip()]


def request_body(args: argparse.Namespace, model: str, prompt: str) -> dict[str, Any]:
    """The streamed chat-completions body of one prompt under the command line's settings."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": args.max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.temperature is not None:
        body["temperature"] = args.temperature
    if not args.no_token_ids:
        body["return_token_ids"] = True
    if args.chat_template_kwargs:
        body["chat_template_kwargs"] = json.loads(args.chat_template_kwargs)
    return body


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = args.base_url.rstrip("/")
    model = args.model or fetch_models(base, args.timeout)[0]
    prompts = load_prompts(args.prompts)
    metrics_url = args.metrics_url or base + "/metrics"
    before = scrape_metrics(metrics_url, args.timeout)
    jobs = [p for _ in range(args.repetitions) for p in prompts]
    results: list[RequestResult] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not jobs:
                    return
                prompt = jobs.pop(0)
            try:
                r = stream_chat(base, request_body(args, model, prompt), args.timeout)
            except BenchError as exc:
                with lock:
                    errors.append(str(exc))
                    jobs.clear()
                return
            with lock:
                results.append(r)

    threads = [threading.Thread(target=worker) for _ in range(max(1, args.concurrency))]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall
    if errors:
        raise BenchError(errors[0])
    after = scrape_metrics(metrics_url, args.timeout)
    summary: dict[str, Any] = {"model": model, "requests": len(results), "wall_s": wall, "phases": {}}
    for phase in PHASES:
        tokens = sum(r.tokens[phase] for r in results)
        seconds = sum(r.seconds[phase] for r in results)
        summary["phases"][phase] = {"tokens": tokens, "seconds": seconds,
                                    "tok_per_s": tokens / seconds if seconds else None}
    ttfts = sorted(r.ttft_s for r in results)
    summary["ttft_s"] = {"mean": sum(ttfts) / len(ttfts) if ttfts else None,
                         "p50": ttfts[len(ttfts) // 2] if ttfts else None}
    summary["approximate_tokens"] = any(r.approximate_tokens for r in results)
    summary["metrics"] = metrics_delta(before, after)
    summary["per_request"] = [asdict(r) for r in results]
    return summary


def print_summary(s: dict[str, Any]) -> None:
    approx = " (approx.: one token per chunk)" if s["approximate_tokens"] else ""
    print(f"model {s['model']}: {s['requests']} requests in {s['wall_s']:.2f} s; "
          f"TTFT mean {s['ttft_s']['mean'] or 0:.3f} s, p50 {s['ttft_s']['p50'] or 0:.3f} s")
    print(f"{'phase':<10} {'tokens':>8} {'seconds':>9} {'tok/s':>8} {'accept%':>8} {'verified':>9} {'accepted':>9}")
    m = s.get("metrics")
    for phase, p in s["phases"].items():
        acc = ver = accd = ""
        if m and m.get("has_phase_series"):
            mp = m["phases"][phase]
            acc = f"{100 * mp['acceptance']:.1f}%" if mp["acceptance"] is not None else "-"
            ver, accd = f"{mp['verified']:.0f}", f"{mp['accepted']:.0f}"
        tps = f"{p['tok_per_s']:.2f}" if p["tok_per_s"] else "-"
        print(f"{phase:<10} {p['tokens']:>8} {p['seconds']:>9.2f} {tps:>8} {acc:>8} {ver:>9} {accd:>9}{approx}")
    if m is None:
        print("no usable /metrics on the server: acceptance not shown")
    else:
        v = m["vllm"]
        rate = f"{100 * v['accepted_tokens'] / v['draft_tokens']:.1f}%" if v["draft_tokens"] else "-"
        print(f"vLLM spec decode: drafts {v['drafts']:.0f}, draft tokens {v['draft_tokens']:.0f}, "
              f"accepted {v['accepted_tokens']:.0f} ({rate})")
        if not m["has_phase_series"]:
            print("the server has no dspark_dynamic:* series (plugin not installed or not configured)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="dspark-dynamic-bench",
        description="Per-phase (reasoning / answer) tok/s, TTFT and draft acceptance of an OpenAI-compatible "
                    "chat server, from streamed chat completions and its /metrics.  Exit 2 on a failed run.")
    ap.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)")
    ap.add_argument("--model", help="model name (default: the server's first)")
    ap.add_argument("--prompts", help=f"file: a JSON list of prompts, or one prompt per line "
                                      f"(default: {len(DEFAULT_PROMPTS)} built-in reasoning prompts)")
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight (default: %(default)s)")
    ap.add_argument("--repetitions", type=int, default=1, help="times each prompt is sent (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=1024, help="per request (default: %(default)s)")
    ap.add_argument("--temperature", type=float, help="default: the server's (0 with --policies)")
    ap.add_argument("--chat-template-kwargs", help='JSON, e.g. \'{"thinking": true}\'')
    ap.add_argument("--metrics-url", help="default: BASE_URL/metrics")
    ap.add_argument("--no-token-ids", action="store_true", help="do not ask for token_ids (non-vLLM servers)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default: %(default)s)")
    ap.add_argument("--json", help="write the full result as JSON to this file ('-' = stdout)")
    g = ap.add_argument_group(
        "paired policy comparison on one server",
        "Every arm runs the same prompts in every round, in an order rotated per round; ratios are "
        "medians of per-round ratios to the reference with their IQR, next to an A/A pair.")
    g.add_argument("--policies", metavar="SPECS",
                   help='comma-separated policies, each sent per request as vllm_xargs: "fixed K" ("depth K"), '
                        '"phase R/A", a policy name ("adaptive"), or "server" (none sent); turns the mode on')
    g.add_argument("--rounds", type=int, help="paired rounds (default: 5)")
    g.add_argument("--reference", metavar="SPEC", help="the denominator of the ratios (default: the first policy)")
    g.add_argument("--aa", metavar="SPEC", help="the policy run twice per round as an A/A pair "
                                                "(default: the reference)")
    g.add_argument("--no-aa", action="store_true", help="no A/A pair")
    g.add_argument("--mix", action="store_true",
                   help="send a round's requests of all arms together, interleaved: policies share steps")
    g.add_argument("--plain-url", metavar="URL",
                   help="a server without speculative decoding, run at the end of each round (unpaired)")
    g.add_argument("--plot", metavar="FILE.png", help="a figure of tok/s and paired ratios (needs matplotlib)")
    g.add_argument("--progress", action="store_true", help="a progress line on stderr even when it is no TTY")
    return ap


POLICY_ONLY = ("rounds", "reference", "aa", "no_aa", "mix", "plain_url", "plot", "progress")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.policies is not None:
        from dspark_dynamic.tools import bench_policies

        return bench_policies.main(args)
    stray = ["--" + name.replace("_", "-") for name in POLICY_ONLY if getattr(args, name)]
    if stray:
        print(f"dspark-dynamic-bench: error: {', '.join(stray)} needs --policies", file=sys.stderr)
        return 2
    try:
        summary = run(args)
    except BenchError as exc:
        print(f"dspark-dynamic-bench: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, KeyError) as exc:
        print(f"dspark-dynamic-bench: error: bad input or response: {exc}", file=sys.stderr)
        return 2
    if args.json == "-":
        json.dump(summary, sys.stdout, indent=1)
        print()
    else:
        print_summary(summary)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

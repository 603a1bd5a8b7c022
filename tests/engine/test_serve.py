"""`vllm serve` on 127.0.0.1 with the controller on, measured by the benchmark client."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dspark_lab.serve import free_port
from dspark_lab.engine_run import engine_env
from dspark_lab.scenarios import SCRIPT
from dspark_dynamic.tools import bench_client

REPETITIONS = 2


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
           "--max-model-len", "512", "--max-num-seqs", "4", "--enforce-eager",
           "--dtype", "float32",  # bf16 on AMX CPUs: see test_soak_checks.py
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
    # depth 2 in the answer, but the first answer step of each request verifies the one draft that
    # was asked for while it still reasoned
    n = bench["requests"]
    assert 2 * phases["answer"]["steps"] - n <= phases["answer"]["verified"] <= 2 * phases["answer"]["steps"]
    assert phases["reasoning"]["acceptance"] == 1.0  # the oracle draft
    # decode-step tokens per phase: the client's count minus each request's first (prefill) token
    assert phases["reasoning"]["tokens"] == bench["phases"]["reasoning"]["tokens"] - n
    assert phases["answer"]["tokens"] == bench["phases"]["answer"]["tokens"]


def test_metrics_endpoint_has_labelled_series(server, bench):
    text = urllib.request.urlopen(server + "/metrics", timeout=10).read().decode()
    for name in ("steps_total", "verified_draft_tokens_total", "accepted_draft_tokens_total",
                 "generated_tokens_total", "depth_steps_total", "tracked_requests"):
        assert f"dspark_dynamic:{name}{{" in text
    assert 'phase="reasoning"' in text and 'phase="answer"' in text


# -- load: many clients at once, some closing their stream early, and vLLM's own benchmark ----

CLIENTS = 32
EXPECTED = SCRIPT.expected_output(thinking=True)


def post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def client(server, i):
    """One of three kinds: a stream closed after 5 chunks, a stream read to the end, a plain
    completion.  Returns what it saw."""
    kind = ("closed early", "streamed", "plain")[i % 3]
    if kind == "plain":
        body = {"model": "tiny", "prompt": "<|user|> f00%d <|assistant|> <think>" % (i % 10), "max_tokens": 300,
                "temperature": 0, "return_token_ids": True}
        with post(server + "/v1/completions", body) as resp:
            choice = json.loads(resp.read())["choices"][0]
        return kind, choice["finish_reason"], choice.get("token_ids")
    body = {"model": "tiny", "messages": [{"role": "user", "content": "f00%d" % (i % 10)}], "max_tokens": 300,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    resp = post(server + "/v1/chat/completions", body)
    chunks, finish, usage = 0, None, None
    for line in resp:
        event = bench_client.parse_sse_line(line)
        if event is None:
            continue
        chunks += 1
        if kind == "closed early" and chunks >= 5:
            break  # the client goes away mid-generation
        for choice in event.get("choices", []):
            finish = choice.get("finish_reason") or finish
        usage = event.get("usage") or usage
    resp.close()
    return kind, finish, usage


@pytest.fixture(scope="module")
def load(server, bench, target, tmp_path_factory):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(lambda i: client(server, i), range(CLIENTS)))
    cmd = [str(Path(sys.executable).with_name("vllm")), "bench", "serve", "--backend", "openai",
           "--base-url", server, "--endpoint", "/v1/completions", "--model", "tiny", "--tokenizer", target,
           "--dataset-name", "random", "--random-input-len", "8", "--random-output-len", "24",
           "--num-prompts", "24", "--max-concurrency", "8", "--disable-tqdm"]
    env = {**os.environ, **engine_env()}
    bench_serve = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    time.sleep(1.0)  # the engine publishes its idle state when the last request leaves
    return {"clients": results, "bench_serve": bench_serve,
            "metrics": bench_client.metrics_delta({}, bench_client.scrape_metrics(server + "/metrics", 10)),
            "samples": bench_client.scrape_metrics(server + "/metrics", 10)}


def test_every_finished_request_is_exact(load):
    kinds = [r[0] for r in load["clients"]]
    assert kinds.count("closed early") >= 10
    for kind, finish, extra in load["clients"]:
        if kind == "plain":
            assert finish == "stop" and extra == EXPECTED
        elif kind == "streamed":
            assert finish == "stop" and extra["completion_tokens"] == len(EXPECTED)


def test_vllm_bench_serve_runs_against_the_controller(load):
    out = load["bench_serve"]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    import re

    assert int(re.search(r"Successful requests:\s+(\d+)", out.stdout).group(1)) == 24


def test_after_load_the_server_is_healthy_and_counts_agree(server, load):
    assert urllib.request.urlopen(server + "/health", timeout=10).status == 200
    m = load["metrics"]
    ours = {k: sum(p[k] for p in m["phases"].values()) for k in ("steps", "verified", "accepted")}
    assert ours == {"steps": m["vllm"]["drafts"], "verified": m["vllm"]["draft_tokens"],
                    "accepted": m["vllm"]["accepted_tokens"]}
    kinds = [r[0] for r in load["clients"]]
    print(f"\nserve load: {len(kinds)} clients ({kinds.count('closed early')} closed early) + 24 by vllm bench serve; "
          f"ours (steps, verified, accepted) = {tuple(ours.values())}, vLLM = "
          f"{(m['vllm']['drafts'], m['vllm']['draft_tokens'], m['vllm']['accepted_tokens'])}")
    tracked = [v for (name, _), v in load["samples"].items() if name == "dspark_dynamic:tracked_requests"]
    assert tracked == [0.0]  # the controller holds no state once every client is gone


# -- a depth policy per request, over the OpenAI API (vllm_xargs) -----------------------------

BAD_XARGS = [  # (vllm_xargs, the key the error names)
    ({"dspark_dynamic_depth": 5}, "dspark_dynamic_depth"),  # above num_speculative_tokens (2)
    ({"dspark_dynamic_depth": "two"}, "dspark_dynamic_depth"),
    ({"dspark_dynamic_policy": "adaptive"}, "dspark_dynamic_policy"),  # this server runs phase 1/2
    ({"dspark_dynamic_dpeth": 1}, "dspark_dynamic_dpeth"),
]


def test_bad_request_policy_is_refused_alone_while_the_others_finish_exact(server, load):
    openai = pytest.importorskip("openai")
    from concurrent.futures import ThreadPoolExecutor

    client = openai.OpenAI(base_url=server + "/v1", api_key="none", max_retries=0, timeout=300)

    def good(i):
        out = client.completions.create(
            model="tiny", prompt="<|user|> f00%d <|assistant|> <think>" % i, max_tokens=300, temperature=0,
            extra_body={"vllm_xargs": {"dspark_dynamic_depth": i % 3}, "return_token_ids": True})
        return out.choices[0].model_dump().get("token_ids")

    def bad(case):
        xargs, _key = case
        try:
            client.completions.create(model="tiny", prompt="<|user|> f001 <|assistant|> <think>", max_tokens=20,
                                      temperature=0, extra_body={"vllm_xargs": xargs})
        except openai.BadRequestError as exc:
            return exc.status_code, str(exc)
        return 200, ""

    health = []
    with ThreadPoolExecutor(8) as pool:
        goods = [pool.submit(good, i) for i in range(6)]
        time.sleep(0.5)  # the good requests are running when the bad ones arrive
        bads = list(pool.map(bad, BAD_XARGS))
        while True:  # at least once, however fast the good requests finished
            health.append(urllib.request.urlopen(server + "/health", timeout=10).status)
            if all(f.done() for f in goods):
                break
            time.sleep(0.2)
        results = [f.result() for f in goods]
    assert results == [EXPECTED] * 6
    for (xargs, key), (status, message) in zip(BAD_XARGS, bads):
        assert status == 400, (xargs, message)
        assert key in message and "allowed" in message
    assert health and set(health) == {200}
    samples = bench_client.scrape_metrics(server + "/metrics", 10)
    errors = [v for (name, _), v in samples.items() if name == "dspark_dynamic:controller_errors_total"]
    assert errors and set(errors) == {0.0}
    by_policy = {dict(labels)["policy"] for (name, labels), _v in samples.items()
                 if name == "dspark_dynamic:policy_verified_draft_tokens_total"}
    assert {"fixed 0", "fixed 1", "fixed 2", "phase 1/2"} <= by_policy
    verified_at_0 = sum(v for (name, labels), v in samples.items()
                        if name == "dspark_dynamic:policy_verified_draft_tokens_total" and dict(labels)["policy"] == "fixed 0")
    assert verified_at_0 == 0

"""vLLM's parallel layouts with the controller on, in real CPU engines (issue #18).

- tensor parallel 2 (``LLM``, two CPU workers): exact outputs, counts equal vLLM's, the controller
  once, in the engine core and not in a worker;
- data parallel 2 behind ``vllm serve`` — which also starts 2 API servers, so this one server
  covers ``--api-server-count 2`` too: exact outputs, one controller per engine core, and on
  ``/metrics`` the ``dspark_dynamic:*`` series of both engines (label ``engine`` = "0", "1", as on
  vLLM's own series) summing per engine to vLLM's spec-decode counters; a short soak (every
  kind of ending) leaves no controller state;
- pipeline parallel 2 and the Ray executor: vLLM itself refuses them on the CPU (with the plugin
  or without); the tests show the refusal, so they fail once vLLM accepts them.
"""

from __future__ import annotations

import re

import pytest

from dspark_lab import layouts, soak
from dspark_lab.engine_run import run_in_subprocess
from dspark_lab.serve import TinyServer, per_rank_cores

CONTROLLER_ON = "dspark_dynamic: depth controller on"


def controller_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if CONTROLLER_ON in line]


def process_of(line: str) -> str:
    """vLLM's log prefix ``(EngineCore_DP0 pid=123)`` -> ``EngineCore_DP0``."""
    m = re.match(r"\((\S+) pid=\d+\)", line)
    return m.group(1) if m else ""


# -- tensor parallel 2 -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tp2(target, phase_draft, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", per_rank_cores(2))  # one core per TP worker
        spec = layouts.engine_spec(target, phase_draft, {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"})
        return run_in_subprocess(spec, tmp_path_factory.mktemp("tp2"))


def test_tp2_outputs_are_exact(tp2):
    assert tp2["batches"][0]["outputs"] == layouts.EXPECTED


def test_tp2_per_phase_counts_equal_vllms(tp2):
    batch = tp2["batches"][0]
    v, phases = batch["vllm"], batch["phases"]
    assert set(phases) == {"reasoning", "answer"}
    assert sum(p["steps"] for p in phases.values()) == v["vllm:spec_decode_num_drafts"] > 0
    assert sum(p["verified"] for p in phases.values()) == v["vllm:spec_decode_num_draft_tokens"]
    assert sum(p["accepted"] for p in phases.values()) == v["vllm:spec_decode_num_accepted_tokens"]
    assert phases["reasoning"]["verified"] == phases["reasoning"]["steps"]  # depth 1 while reasoning
    assert batch["live_states"] == 0


def test_tp2_controller_runs_once_in_the_engine_core_not_in_the_workers(tp2):
    log = tp2["log"]
    assert "Worker_TP0" in log and "Worker_TP1" in log  # two tensor-parallel worker processes ran
    lines = controller_lines(log)
    assert len(lines) == 1 and not process_of(lines[0]).startswith("Worker")


# -- data parallel 2 (and 2 API servers) behind vllm serve --------------------------------------


@pytest.fixture(scope="module")
def dp2(target, phase_draft, tmp_path_factory):
    log = tmp_path_factory.mktemp("dp2") / "serve.log"
    server = TinyServer(target, phase_draft, log, extra_args=["--data-parallel-size", "2"], max_num_seqs=8,
                        dtype="float32")  # bf16 on AMX CPUs: see test_soak_checks.py
    try:
        server.start()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def dp2_run(dp2):
    """Both phases on both engines, then idle: outputs, per-engine metrics, engine-core pids.

    Each engine gets two thinking and two plain requests, pinned with vLLM's ``X-data-parallel-rank``
    header (the coordinator's load balancing alone may give one engine a single phase)."""
    from concurrent.futures import ThreadPoolExecutor

    reqs = [{"kind": "full", "body": {"model": "tiny", "prompt": soak.prompt(i, thinking), "max_tokens": 300,
                                       "temperature": 0, "return_token_ids": True},
             "expect": layouts.EXPECTED[0 if thinking else 1], "finish": "stop", "engine": (i // 2) % 2}
            for i, thinking in enumerate([True, False] * 4)]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda r: soak.send(dp2.url, r), reqs))
    return {"results": results, "engines": soak.wait_idle(dp2.scrape), "pids": dp2.engine_core_pids()}


def test_dp2_outputs_are_exact(dp2_run):
    assert [r["why"] for r in dp2_run["results"] if not r["ok"]] == []


def test_dp2_runs_two_engine_cores_two_api_servers_one_controller_each(dp2, dp2_run):
    assert set(dp2_run["pids"]) == {"EngineCore_DP0", "EngineCore_DP1"}
    log = dp2.log_text()
    assert "ApiServer_0" in log and "ApiServer_1" in log  # vLLM defaults api_server_count to the DP size
    assert sorted(process_of(line) for line in controller_lines(log)) == ["EngineCore_DP0", "EngineCore_DP1"]


def test_dp2_metrics_carry_each_engine_and_sum_to_vllms_per_engine(dp2_run):
    engines = dp2_run["engines"]
    assert set(engines) == {"0", "1"}  # vLLM's engine index, as on vllm:spec_decode_* (not a pid)
    for label, e in engines.items():
        assert e["steps"] > 0, label  # the DP coordinator gave both engines work
        assert (e["steps"], e["verified"], e["accepted"]) == (
            e["vllm_drafts"], e["vllm_draft_tokens"], e["vllm_accepted_tokens"]), label
        assert e["tracked"] == 0, label


def test_dp2_metrics_are_split_by_phase(dp2, dp2_run):
    samples = dp2.scrape()
    phases = {(dict(lab)["engine"], dict(lab)["phase"]) for (name, lab), v in samples.items()
              if name == "dspark_dynamic:verified_draft_tokens_total" and v > 0}
    assert phases == {(e, p) for e in ("0", "1") for p in ("reasoning", "answer")}


def test_dp2_soak_smoke_every_ending_leaves_no_state(dp2, dp2_run):
    report = soak.run_soak(dp2.url, requests=150, concurrency=8, warmup=0, scrape=dp2.scrape)
    print("\n" + soak.format_report(report))
    assert set(report["by_kind"]) == set(soak.KINDS)
    assert report["wrong"] == 0, report["wrong_examples"]
    assert report["tracked_end"] == 0 and report["counts_agree"]


# -- refused by vLLM on the CPU -----------------------------------------------------------------


def refusal(spec, workdir) -> str:
    with pytest.raises(RuntimeError) as info:
        run_in_subprocess(spec, workdir, timeout=300)
    return str(info.value) + (workdir / "engine.log").read_text(errors="replace")


def test_pipeline_parallel_2_with_speculative_decoding_is_refused_by_vllm(tmp_path):
    """vllm(-cpu) 0.32 builds the drafter on the last pipeline stage only, then reads it on every
    stage while binding the KV cache (``gpu_model_runner.py``: ``getattr(self.drafter, ...)``)."""
    target = str(layouts.build_two_layer_target())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", per_rank_cores(2))
        spec = layouts.engine_spec(target, None, {"pipeline_parallel_size": 2, "distributed_executor_backend": "mp"})
        text = refusal(spec, tmp_path)
    assert "'CPUModelRunner' object has no attribute 'drafter'" in text
    assert "vllm/v1/worker/gpu_model_runner.py" in text


def test_ray_executor_is_refused_by_vllm_on_cpu(target, tmp_path):
    pytest.importorskip("ray")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        spec = layouts.engine_spec(target, None, {"distributed_executor_backend": "ray"})
        text = refusal(spec, tmp_path)
    assert "current platform cpu does not support ray." in text
    assert "vllm/v1/executor/ray_utils.py" in text

"""Fail open in a real engine: a fault in the plugin never stops it (issue #18, part 3).

One engine (in-process engine core, draft_model, depths 1/2) runs a batch of requests per
fault: a fresh controller is attached, the fault strikes a few steps in while all requests are
in flight, and the batch must finish exactly as plain greedy decoding would (the tiny models'
script), with the fault logged once with its traceback, counted, the controller detached and
vLLM's own speculative decoding (full depth, no draft bound) doing the rest.  A second engine
has the fault strike while the controller is built.  The faults come from
``dspark_lab.faults``; the raising reasoning-parser plugin and ``/health`` under
streams are in ``test_fail_open_serve.py``.
"""

from __future__ import annotations

import json
import os

import pytest

from dspark_lab.engine_run import run_in_subprocess
from dspark_lab.scenarios import ANSWER_PROMPT, SCRIPT, THINKING_PROMPT

from conftest import counters_delta

SHORT, LONG = 20, 120
# four requests in flight: three long, one that finishes early (so free_request strikes mid-run)
LOAD = [{"prompt_ids": THINKING_PROMPT, "max_tokens": LONG}, {"prompt_ids": THINKING_PROMPT, "max_tokens": LONG},
        {"prompt_ids": ANSWER_PROMPT, "max_tokens": 300}, {"prompt_ids": THINKING_PROMPT, "max_tokens": SHORT}]
EXPECTED = [SCRIPT.expected_output(True)[:LONG], SCRIPT.expected_output(True)[:LONG], SCRIPT.expected_output(False),
            SCRIPT.expected_output(True)[:SHORT]]
assert len(SCRIPT.expected_output(True)) > LONG and len(SCRIPT.expected_output(False)) < 300

# fault point -> (the N+1-th call strikes, the hook named in the log line, what was raised)
FAULTS = {
    "schedule": (8, "Scheduler.schedule", "InjectedFault"),
    "plan": (8, "Scheduler._update_after_schedule", "InjectedFault"),
    "after_output": (8, "Scheduler.update_from_output", "InjectedFault"),
    "spec_stats": (20, "Scheduler.make_spec_decoding_stats", "InjectedFault"),
    "free_request": (0, "Scheduler._free_request", "InjectedFault"),
    "trace_full": (30, "Scheduler.update_from_output", "OSError: [Errno 28] No space left on device"),
    "metrics_dir_removed": (8, "Scheduler.", "FileNotFoundError"),
    "metrics_dir_unwritable": (8, "Scheduler.", "NotADirectoryError"),
}
BASELINE = 0  # batch 0: no fault, the controller at work


def _spec(target, faults):
    return {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": target, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": {"reasoning_depth": 1, "answer_depth": 2}},
        "batches": [LOAD] * len(faults),
        "faults": faults,
    }


def _run(target, tmp_path_factory, name, faults):
    workdir = tmp_path_factory.mktemp(name)
    with pytest.MonkeyPatch.context() as mp:  # the snapshot directory, where the test can see it
        mp.setenv("DSPARK_DYNAMIC_METRICS_DIR", str(workdir / "metrics"))
        return run_in_subprocess(_spec(target, faults), workdir)


@pytest.fixture(scope="module")
def hooks_run(target, tmp_path_factory):
    faults = [None] + [{"at": point, "after": after} for point, (after, _, _) in FAULTS.items()]
    return _run(target, tmp_path_factory, "fail_open_hooks", faults)


@pytest.fixture(scope="module")
def init_run(target, tmp_path_factory):
    return _run(target, tmp_path_factory, "fail_open_init", [{"at": "init"}])


def _mean_depth_after_the_fault(run, batch):
    """vLLM's request-steps and drafts verified in ``batch`` after the controller let go (all of
    vLLM's minus what the controller counted before the fault), and their mean depth."""
    vllm = counters_delta(run, batch)
    ours = run["batches"][batch]["phases"]
    steps = vllm["drafts"] - sum(p["steps"] for p in ours.values())
    verified = vllm["draft_tokens"] - sum(p["verified"] for p in ours.values())
    return steps, verified / steps


def test_without_a_fault_the_controller_works(hooks_run):
    batch = hooks_run["batches"][BASELINE]
    assert batch["outputs"] == EXPECTED
    fo = batch["fail_open"]
    assert fo["errors"] == 0 and fo["attached"] and not fo["records"] and fo["snapshot"]["controller_errors"] == 0
    vllm = counters_delta(hooks_run, BASELINE)
    assert vllm["draft_tokens"] / vllm["drafts"] < 1.6  # depth 1 while reasoning


@pytest.mark.parametrize("point", list(FAULTS))
def test_a_fault_detaches_the_controller_and_every_request_finishes_exactly(hooks_run, point):
    i = 1 + list(FAULTS).index(point)
    batch = hooks_run["batches"][i]
    fo = batch["fail_open"]
    _, hook_name, raised = FAULTS[point]
    assert batch["outputs"] == EXPECTED, f"{point}: outputs differ from plain greedy decoding"
    assert fo["errors"] == i, f"{point}: counted {fo['errors'] - (i - 1)} faults, not 1"
    assert not fo["attached"]
    (record,) = fo["records"]  # logged once, with its traceback
    assert record["level"] == "ERROR" and record["traceback"]
    assert f"({hook_name}" in record["message"] and raised in record["message"], record["message"]
    assert "full configured depth" in record["message"]
    assert batch["live_states"] == 0  # the detached controller holds nothing
    # the fault struck mid-run, and vLLM's own speculative decoding did the rest at full depth
    steps, depth = _mean_depth_after_the_fault(hooks_run, i)
    assert steps >= 20, f"{point}: only {steps} request-steps after the fault"
    assert depth > 1.85, f"{point}: mean depth {depth:.2f} after the fault"


def test_the_snapshot_counts_the_faults(hooks_run):
    for i, point in enumerate(FAULTS, start=1):
        snap = hooks_run["batches"][i]["fail_open"]["snapshot"]
        if point.startswith("metrics_dir"):
            assert snap is None  # nowhere to write it
        else:  # published when the controller was detached
            assert snap["controller_errors"] == i and snap["tracked"] == 0, point


def test_each_fault_is_logged_once_in_the_engine_log(hooks_run):
    log = hooks_run["log"]
    assert log.count("dspark_dynamic: fault in the plugin") == len(FAULTS)
    assert log.count("Traceback (most recent call last)") >= len(FAULTS)


def test_a_fault_while_building_the_controller_leaves_vllm_serving(init_run):
    batch = init_run["batches"][0]
    fo = batch["fail_open"]
    assert batch["outputs"] == EXPECTED
    assert fo["errors"] == 1 and not fo["attached"] and batch["phases"] is None
    (record,) = fo["records"]
    assert record["traceback"] and "(Scheduler.__init__ raised InjectedFault" in record["message"]
    assert fo["snapshot"]["controller_errors"] == 1 and fo["snapshot"]["phases"] == {}
    vllm = counters_delta(init_run, 0)
    assert vllm["draft_tokens"] == 2 * vllm["drafts"] > 0  # vLLM alone: full depth, every step

"""The depth controller inside a real vLLM engine (CPU, tiny models)."""

import json

import pytest

from dspark_lab.scenarios import (
    ANSWER_ONLY,
    BATCHES,
    FULL,
    NGRAM,
    REASONING_ONLY,
    SCRIPT,
    THINKING_PROMPT,
)

from conftest import counters_delta
from test_smoke import oracle_fixed_spec, plain_spec

DEPTHS = {"reasoning_depth": 1, "answer_depth": 2}
NGRAM_SPEC = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 2}


def assert_answer_depth_2(depth_counts, crossings):
    """Depth 2 in the answer, except for at most one step per request that crossed </think>:
    that step's drafts were asked for while the request still reasoned (one draft)."""
    assert set(depth_counts) <= {"1", "2"} and depth_counts["2"] > 10
    assert depth_counts.get("1", 0) <= crossings


def outputs(report):
    return [b["outputs"] for b in report["batches"]]


@pytest.fixture(scope="module")
def plain(engine, target):
    return engine("plain", plain_spec(target))


@pytest.fixture(scope="module")
def oracle_ctl(engine, target, tmp_path_factory):
    trace = tmp_path_factory.mktemp("trace") / "trace.jsonl"
    # DSpark-style alias with another drafter underneath, sync scheduler
    spec = {
        "model": target,
        "speculative_config": {"method": "dspark_dynamic", "base_method": "draft_model", "model": target,
                               "num_speculative_tokens": 2, **DEPTHS, "trace_path": str(trace)},
        "engine": {"async_scheduling": False},
        "batches": BATCHES,
    }
    report = engine("oracle_ctl", spec)
    report["trace"] = [json.loads(line) for line in trace.read_text().splitlines()]
    return report


@pytest.fixture(scope="module")
def phase_fixed(engine, target, phase_draft):
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": phase_draft, "num_speculative_tokens": 2},
        "batches": BATCHES,
    }
    return engine("phase_fixed", spec)


@pytest.fixture(scope="module")
def phase_ctl(engine, target, phase_draft):
    # generic form (additional_config); the AsyncScheduler class (the CPU platform forces
    # async_scheduling off, so the class runs in the sync engine loop here)
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": phase_draft, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": DEPTHS},
        "engine": {"scheduler_cls": "vllm.v1.core.sched.async_scheduler.AsyncScheduler"},
        "batches": BATCHES,
    }
    return engine("phase_ctl", spec)


def test_oracle_outputs_identical_to_plain(plain, oracle_ctl):
    assert outputs(oracle_ctl) == outputs(plain)
    assert oracle_ctl["scheduler_cls"] == "Scheduler"


def test_verified_depth_is_1_while_reasoning_and_2_while_answering(oracle_ctl, engine, target):
    fixed = engine("oracle_fixed", oracle_fixed_spec(target))
    reasoning = counters_delta(oracle_ctl, REASONING_ONLY)
    answer = counters_delta(oracle_ctl, ANSWER_ONLY)
    assert reasoning["draft_tokens"] == reasoning["drafts"] > 20  # k = 1 on every reasoning step
    assert answer["draft_tokens"] == 2 * answer["drafts"] > 10  # k = 2 on every answer step
    for batch in (REASONING_ONLY, ANSWER_ONLY):  # without the controller: 2 throughout
        c = counters_delta(fixed, batch)
        assert c["draft_tokens"] == 2 * c["drafts"]


def test_full_script_splits_by_phase_in_vllms_counters(oracle_ctl):
    # 100 % acceptance: a step at depth k yields k+1 tokens. From vLLM's two counters alone:
    c = counters_delta(oracle_ctl, FULL)
    answer_steps = c["draft_tokens"] - c["drafts"]
    reasoning_steps = c["drafts"] - answer_steps
    reasoning_tokens = SCRIPT.reasoning_len + 1  # up to and including </think>
    answer_tokens = SCRIPT.answer_len + 1  # answer + EOS
    assert abs(2 * reasoning_steps - reasoning_tokens) <= 3  # boundary lag: a step or two
    assert abs(3 * answer_steps - answer_tokens) <= 4


def test_controller_counts_agree_with_vllm(oracle_ctl, phase_ctl):
    for report in (oracle_ctl, phase_ctl):
        last = report["batches"][-1]
        phases = last["phases"]
        assert sum(p["verified"] for p in phases.values()) == last["vllm"]["vllm:spec_decode_num_draft_tokens"]
        assert sum(p["accepted"] for p in phases.values()) == last["vllm"]["vllm:spec_decode_num_accepted_tokens"]
        assert sum(p["steps"] for p in phases.values()) == last["vllm"]["vllm:spec_decode_num_drafts"]
        assert set(phases["reasoning"]["depth_counts"]) == {"1"}
        assert_answer_depth_2(phases["answer"]["depth_counts"], crossings=2)


def test_trace_rows_follow_the_phase(oracle_ctl):
    rows = [r for r in oracle_ctl["trace"] if "phase" in r]
    assert {r["k"] for r in rows if r["phase"] == "reasoning"} == {1}
    answer_k = [r["k"] for r in rows if r["phase"] == "answer"]
    assert_answer_depth_2({str(k): answer_k.count(k) for k in set(answer_k)}, crossings=2)
    steps = [r for r in oracle_ctl["trace"] if "step_s" in r]
    assert steps and all(r["step_s"] > 0 for r in steps)
    # the drafter was asked for the deepest planned depth: 1 while only reasoning, 2 in the answer
    assert {r["draft_depth"] for r in steps if r["decode_only"]} == {1, 2}


def test_phase_draft_outputs_identical_to_plain(plain, phase_fixed, phase_ctl):
    assert outputs(phase_fixed) == outputs(plain)
    assert outputs(phase_ctl) == outputs(plain)
    assert phase_ctl["scheduler_cls"] == "AsyncScheduler"


def test_phase_draft_rejections_in_reasoning_fall_by_about_half(phase_fixed, phase_ctl):
    fixed = counters_delta(phase_fixed, REASONING_ONLY)
    ctl = counters_delta(phase_ctl, REASONING_ONLY)
    rejected_fixed = fixed["draft_tokens"] - fixed["accepted_tokens"]
    rejected_ctl = ctl["draft_tokens"] - ctl["accepted_tokens"]
    assert rejected_fixed > 20
    assert 0.25 <= rejected_ctl / rejected_fixed <= 0.7, (rejected_ctl, rejected_fixed)
    # the answer keeps its full depth
    a_fixed, a_ctl = counters_delta(phase_fixed, ANSWER_ONLY), counters_delta(phase_ctl, ANSWER_ONLY)
    assert a_ctl == a_fixed


@pytest.mark.parametrize("controlled", [False, True], ids=["fixed", "controller"])
def test_ngram_outputs_identical_to_plain(engine, target, plain, controlled):
    spec = {"model": target, "speculative_config": NGRAM_SPEC, "batches": BATCHES}
    if controlled:
        spec["additional_config"] = {"dspark_dynamic": DEPTHS}
    report = engine(f"ngram_{controlled}", spec)
    assert outputs(report) == outputs(plain)
    c = counters_delta(report, NGRAM)
    assert c["drafts"] > 10 and c["accepted_tokens"] > 10  # ngram really drafted here
    if controlled:
        phases = report["batches"][NGRAM]["phases"]
        assert set(phases["reasoning"]["depth_counts"]) <= {"1"}
        assert "2" in phases["answer"]["depth_counts"]


def test_many_aborted_requests_leave_no_state(engine, target):
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": target, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": DEPTHS},
        "batches": [],
        "abort_storm": {"requests": 1000, "prompt_ids": THINKING_PROMPT, "max_tokens": 6},
    }
    storm = engine("storm", spec)["abort_storm"]
    assert storm["aborted"] > 100 and storm["finished"] > 100
    assert storm["peak_states"] > 50  # the controller did track many requests at once
    assert storm["live_states"] == 0


def test_adaptive_policy_in_the_engine(engine, target, phase_draft, plain, phase_ctl):
    from dspark_lab.simulate import CostModel, modeled_tok_per_s

    cost = CostModel(75.0, 3.0, 37.75)
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": phase_draft, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": {**DEPTHS, "policy": "adaptive", "adaptive": {
            "verify_cost_ratio": 37.75 / 75, "draft_cost_ratio": 3 / 75, "learn_cost": False}}},
        "batches": BATCHES,
    }
    adaptive = engine("adaptive", spec)
    assert outputs(adaptive) == outputs(plain)
    final = adaptive["batches"][-1]
    phases = final["phases"]
    # the controller's counts still match vLLM's own
    assert sum(p["verified"] for p in phases.values()) == final["vllm"]["vllm:spec_decode_num_draft_tokens"]
    # the 40 %-right reasoning drafts are mostly not verified any more
    assert phases["reasoning"]["depth_counts"].get("0", 0) > phases["reasoning"]["depth_counts"].get("1", 0)
    assert modeled_tok_per_s(phases, cost) >= modeled_tok_per_s(phase_ctl["batches"][-1]["phases"], cost)


def test_preemption_and_chunked_prefill(engine, target):
    """A KV cache too small for the batch (requests are preempted and re-admitted) and a small
    token budget (long prompts prefill in chunks): outputs stay on the script, each phase keeps
    its depth, and no state is left behind."""
    filler = SCRIPT.filler_ids()
    long_prompt = [filler[i % len(filler)] for i in range(150)] + THINKING_PROMPT
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": target, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": DEPTHS},
        "engine": {"num_gpu_blocks_override": 8, "max_num_batched_tokens": 64, "enable_chunked_prefill": True},
        "batches": [[{"prompt_ids": long_prompt, "max_tokens": 300} for _ in range(5)]],
    }
    b = engine("stress", spec)["batches"][0]
    assert b["outputs"] == [SCRIPT.expected_output(thinking=True)] * 5
    assert b["vllm"]["vllm:num_preemptions"] > 0  # the tight cache really preempted
    phases, v = b["phases"], b["vllm"]  # preempted and resumed requests count exactly like vLLM's
    assert sum(p["steps"] for p in phases.values()) == v["vllm:spec_decode_num_drafts"]
    assert sum(p["verified"] for p in phases.values()) == v["vllm:spec_decode_num_draft_tokens"]
    assert sum(p["accepted"] for p in phases.values()) == v["vllm:spec_decode_num_accepted_tokens"]
    assert set(b["phases"]["reasoning"]["depth_counts"]) == {"1"}
    assert_answer_depth_2(b["phases"]["answer"]["depth_counts"], crossings=5)
    assert b["live_states"] == 0

"""Steps that draft nothing, in a real vLLM engine: the draft_model forward is skipped (the
drafter's cache is caught up before it drafts again, so it proposes exactly what it proposes
when its forward runs every step), and so is vLLM's rejection sampler (test_sampling.py shows
the plain sampler's tokens and logprobs are plain decoding's); a step that verifies no draft and
leaves the drafter idle runs the runner's plain decoding branches (``plain_step``)."""

import pytest

from dspark_lab import tiny_models
from dspark_lab.engine_run import run_in_subprocess
from dspark_lab.scenarios import SCRIPT, THINKING_PROMPT
from dspark_lab.serve import per_rank_cores

# Reasoning at depth 0 (idle drafter, skipped), the answer at depth 2 (drafts from a cache
# that must hold every reasoning position); a second batch runs two requests side by side.
OTHER_PROMPT = THINKING_PROMPT[:-3] + THINKING_PROMPT[-2:]
BATCHES = [
    [{"prompt_ids": THINKING_PROMPT, "max_tokens": 200}],
    [{"prompt_ids": THINKING_PROMPT, "max_tokens": 200}, {"prompt_ids": OTHER_PROMPT, "max_tokens": 150}],
]


@pytest.fixture(scope="module")
def context_draft():
    return str(tiny_models.build_context_draft(SCRIPT))


def spec(target, draft, skip):
    return {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": draft, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": {"reasoning_depth": 0, "answer_depth": 2, "skip_idle_drafter": skip}},
        "record_drafts": True,
        "batches": BATCHES,
    }


@pytest.fixture(scope="module")
def skipping(engine, target, context_draft):
    return engine("drafter_skip_on", spec(target, context_draft, True))


@pytest.fixture(scope="module")
def every_step(engine, target, context_draft):
    return engine("drafter_skip_off", spec(target, context_draft, False))


def test_idle_forwards_are_skipped_and_their_positions_caught_up(skipping, every_step):
    counters = skipping["drafts"]["skip"]
    assert counters["skipped_steps"] > 100  # most reasoning steps
    assert counters["caught_up_positions"] > 100 and counters["lost_positions"] == 0
    assert every_step["drafts"]["skip"] is None  # skip_idle_drafter: false
    assert "skips its forward on steps that draft nothing" in skipping["log"]


def test_a_drafter_whose_drafts_read_its_cache_proposes_exactly_what_it_does_without_skips(skipping, every_step):
    proposals = skipping["drafts"]["proposals"]
    assert len(proposals) > 40  # the answers' drafting steps
    assert proposals == every_step["drafts"]["proposals"]


def test_outputs_are_the_targets_and_counts_match_vllms(skipping, every_step):
    expected = SCRIPT.expected_output(thinking=True)
    for report in (skipping, every_step):
        first, second = (b["outputs"] for b in report["batches"])
        assert first == [expected[:200]] and second[0] == expected[:200]
    for a, b in zip(skipping["batches"], every_step["batches"]):
        assert a["vllm"] == b["vllm"] and a["phases"] == b["phases"]


@pytest.fixture(scope="module")
def tp2_skipping(target, context_draft, tmp_path_factory):
    """Tensor parallel 2 (two worker processes): each rank decides the same skips, or the
    drafter's sharded forward would wait for a rank that skipped it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_OMP_THREADS_BIND", per_rank_cores(2))  # one core per TP worker
        tp2 = {**spec(target, context_draft, True), "record_drafts": False, "batches": BATCHES[1:],
               "engine": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}}
        return run_in_subprocess(tp2, tmp_path_factory.mktemp("drafter_skip_tp2"))


def test_idle_steps_run_the_runners_plain_path_and_restore_its_config(skipping, every_step):
    plain = skipping["drafts"]["plain_steps"]
    # every skipped drafter step ran plain (the reasoning steps at depth 0 but the catch-ups)
    assert plain["steps"] == skipping["drafts"]["skip"]["skipped_steps"] > 100
    assert plain["left_off"] == 0  # every step began with the runner's speculative config
    assert "steps that verify and draft nothing run vLLM's plain decoding path" in skipping["log"]
    assert every_step["drafts"]["plain_steps"] == {"steps": 0, "left_off": 0}  # the drafter runs: never plain
    assert "the drafter's idle forward is not skipped" in every_step["log"]


def test_steps_without_drafts_skip_the_rejection_sampler(skipping):
    steps = skipping["drafts"]["rejection_steps"]  # {deepest draft of the step: steps}
    assert steps.get("0", 0) == 0  # ~300 reasoning steps at depth 0 took the plain branch
    assert sum(steps.values()) > 40  # the answers' steps verified their drafts there


def test_tensor_parallel_ranks_skip_together(tp2_skipping, skipping):
    assert tp2_skipping["log"].count("skips its forward on steps that draft nothing") == 2  # one per rank
    batch = tp2_skipping["batches"][0]
    assert batch["outputs"][0] == SCRIPT.expected_output(thinking=True)[:200]
    assert batch["outputs"] == skipping["batches"][1]["outputs"]
    phases, v = batch["phases"], batch["vllm"]
    assert sum(p["verified"] for p in phases.values()) == v["vllm:spec_decode_num_draft_tokens"] > 0
    assert sum(p["accepted"] for p in phases.values()) == v["vllm:spec_decode_num_accepted_tokens"]

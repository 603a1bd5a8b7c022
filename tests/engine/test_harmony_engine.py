"""Multi-token phase markers in a real vLLM engine: a harmony-style analysis -> final channel.

The tiny target (``lab/dspark_lab/harmony_model.py``) leaves reasoning on the last token of the
three-token ``<|channel|>final<|message|>``; ``--reasoning-parser openai_gptoss`` resolves the
markers, the oracle drafter accepts every draft, and the controller verifies 1 draft while
reasoning and 2 in the answer.  At depth 1 every step commits 2 tokens, so the 3-token marker is
always split across steps.
"""

import json

import pytest

from dspark_lab.harmony_model import HarmonyScript, build_harmony_target

from conftest import counters_delta

SCRIPT = HarmonyScript()
THINK, ANSWER, MIXED = range(3)


@pytest.fixture(scope="module")
def harmony(engine, tmp_path_factory):
    target = build_harmony_target(SCRIPT)
    trace = tmp_path_factory.mktemp("harmony-trace") / "trace.jsonl"
    thinking = {"prompt_ids": SCRIPT.thinking_prompt(), "max_tokens": 300}
    answer = {"prompt_ids": SCRIPT.answer_prompt(), "max_tokens": 300}
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": target, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": {"reasoning_depth": 1, "answer_depth": 2, "trace_path": str(trace)}},
        "engine": {"reasoning_parser": "openai_gptoss", "async_scheduling": False},
        "batches": [[thinking], [answer], [thinking, answer, thinking]],
    }
    report = engine("harmony", spec)
    report["trace"] = [json.loads(line) for line in trace.read_text().splitlines()]
    return report


def test_markers_come_from_the_gptoss_parser_as_sequences(harmony):
    # no marker option was given: the argument-parsing process resolved these from the parser
    ids = harmony["marker_ids"]
    assert ids["reasoning_start_ids"] == [SCRIPT.ids("<|channel|>", "analysis", "<|message|>")]
    assert SCRIPT.ids("<|channel|>", "final", "<|message|>") in ids["reasoning_end_ids"]
    assert ids["reasoning_reset_ids"] == SCRIPT.ids("<|start|>") and harmony["default_phase"] == "reasoning"


def test_greedy_output_is_the_script(harmony):
    think, answer = SCRIPT.expected_output(True), SCRIPT.expected_output(False)
    assert [b["outputs"] for b in harmony["batches"]] == [[think], [answer], [think, answer, think]]


def test_depth_follows_the_channel(harmony):
    r = counters_delta(harmony, ANSWER)  # answer prompt: the final channel from the first token
    assert r["draft_tokens"] == 2 * r["drafts"] > 10
    phases = harmony["batches"][THINK]["phases"]
    assert set(phases["reasoning"]["depth_counts"]) == {"1"}
    # every decoded token up to the final header's last one was decoded in reasoning, none after
    # it (the first output token comes from prefill, outside any decode step)
    assert phases["reasoning"]["tokens"] == SCRIPT.reasoning_tokens() - 1
    answer_depths = phases["answer"]["depth_counts"]
    assert set(answer_depths) <= {"1", "2"} and answer_depths.get("1", 0) <= 1 and answer_depths["2"] > 10


def test_phase_flips_on_the_markers_last_token(harmony):
    rows = [r for r in harmony["trace"] if "phase" in r]
    first = [r for r in rows if r["req"] == rows[0]["req"]]
    phases = [r["phase"] for r in first]
    flip = phases.index("answer")
    assert set(phases[flip:]) == {"answer"} and {r["k"] for r in first[:flip]} == {1}
    # prefill's token, then 2 per step: the 3-token header is split, its last token ends a step
    header = [r["tokens"] for r in first[:flip]]
    assert sum(header) + 1 == SCRIPT.reasoning_tokens() and set(header) == {2}


def test_counts_agree_with_vllm(harmony):
    last = harmony["batches"][-1]
    phases = last["phases"]
    assert sum(p["verified"] for p in phases.values()) == last["vllm"]["vllm:spec_decode_num_draft_tokens"]
    assert sum(p["accepted"] for p in phases.values()) == last["vllm"]["vllm:spec_decode_num_accepted_tokens"]
    assert sum(p["steps"] for p in phases.values()) == last["vllm"]["vllm:spec_decode_num_drafts"]
    assert last["live_states"] == 0

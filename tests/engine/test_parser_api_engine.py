"""The parser-API path in a real vLLM engine: a plugin reasoning parser that names no markers.

``--reasoning-parser dspark_test_api_only --reasoning-parser-plugin
dspark_lab.api_only_parser``: the plugin imports the parser file itself before the
engine starts (vLLM would import it only in the engine core), and the engine core follows each
request's phase through the parser's ``is_reasoning_end_streaming`` on vLLM's own ``Request``.
"""

import pytest

from dspark_lab.scenarios import ANSWER_PROMPT, SCRIPT, THINKING_PROMPT

from conftest import counters_delta

THINK, ANSWER = range(2)


@pytest.fixture(scope="module")
def api_run(engine, target):
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": target, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": {"reasoning_depth": 1, "answer_depth": 2}},
        "engine": {"reasoning_parser": "dspark_test_api_only",
                   "reasoning_parser_plugin": "dspark_lab.api_only_parser"},
        "batches": [[{"prompt_ids": THINKING_PROMPT, "max_tokens": 300}],
                    [{"prompt_ids": ANSWER_PROMPT, "max_tokens": 300}]],
    }
    return engine("parser_api", spec)


def test_phase_follows_the_parsers_own_api(api_run):
    assert "'dspark_test_api_only' (parser API)" in api_run["markers"]
    assert [b["outputs"] for b in api_run["batches"]] == [[SCRIPT.expected_output(True)],
                                                         [SCRIPT.expected_output(False)]]
    phases = api_run["batches"][THINK]["phases"]
    assert set(phases["reasoning"]["depth_counts"]) == {"1"}
    # prefill's token, then 2 per step up to and including </think>: all of it in reasoning
    assert phases["reasoning"]["tokens"] == SCRIPT.reasoning_len
    answer = counters_delta(api_run, ANSWER)  # the prompt ended reasoning: depth 2 from the start
    assert answer["draft_tokens"] == 2 * answer["drafts"] > 10


def test_counts_agree_with_vllm(api_run):
    last = api_run["batches"][-1]
    assert sum(p["verified"] for p in last["phases"].values()) == last["vllm"]["vllm:spec_decode_num_draft_tokens"]
    assert sum(p["accepted"] for p in last["phases"].values()) == last["vllm"]["vllm:spec_decode_num_accepted_tokens"]
    assert sum(p["steps"] for p in last["phases"].values()) == last["vllm"]["vllm:spec_decode_num_drafts"]
    assert last["live_states"] == 0

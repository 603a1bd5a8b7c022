"""Per-phase counts equal vLLM's own counters however a request ends, and no state is left.

One engine (oracle draft: every draft accepted, so steps add up to 3 tokens and every cut lands
inside a multi-token step), one batch per way of ending, counters compared after each batch.
"""

import pytest

from dspark_lab.scenarios import ANSWER_PROMPT, SCRIPT, THINKING_PROMPT

from conftest import counters_delta

V = SCRIPT.vocab()
FULL = SCRIPT.expected_output(thinking=True)
ENDINGS = {
    "max_tokens cut inside a 3-token step": {"prompt_ids": THINKING_PROMPT, "max_tokens": 50},
    "stop token id": {"prompt_ids": ANSWER_PROMPT, "max_tokens": 300, "stop_token_ids": [V["a010"]]},
    "stop string": {"prompt_ids": ANSWER_PROMPT, "max_tokens": 300, "stop": ["a020"]},
    "EOS": {"prompt_ids": THINKING_PROMPT, "max_tokens": 300},
    "ignore_eos": {"prompt_ids": ANSWER_PROMPT, "max_tokens": 80, "ignore_eos": True},
}


def ending_spec(target, scheduler_cls=None):
    spec = {
        "model": target,
        "speculative_config": {"method": "draft_model", "model": target, "num_speculative_tokens": 2},
        "additional_config": {"dspark_dynamic": {"reasoning_depth": 1, "answer_depth": 2}},
        "batches": [[request] for request in ENDINGS.values()],
        "abort_storm": {"requests": 300, "prompt_ids": THINKING_PROMPT, "max_tokens": 40, "in_flight": True},
    }
    if scheduler_cls:
        spec["engine"] = {"scheduler_cls": scheduler_cls}
    return spec


@pytest.fixture(scope="module", params=[None, "vllm.v1.core.sched.async_scheduler.AsyncScheduler"],
                ids=["Scheduler", "AsyncScheduler"])
def endings(request, engine, target):
    return engine(f"endings_{request.param}", ending_spec(target, request.param))


def phase_sums(phases):
    return {key: sum(p[key] for p in phases.values()) for key in ("steps", "verified", "accepted")}


def vllm_sums(batch):
    v = batch["vllm"]
    return {"steps": v["vllm:spec_decode_num_drafts"], "verified": v["vllm:spec_decode_num_draft_tokens"],
            "accepted": v["vllm:spec_decode_num_accepted_tokens"]}


@pytest.mark.parametrize("index, name", list(enumerate(ENDINGS)))
def test_each_ending_counts_like_vllm(endings, index, name):
    batch = endings["batches"][index]
    assert phase_sums(batch["phases"]) == vllm_sums(batch), name  # cumulative, through this ending
    assert counters_delta(endings, index)["drafts"] > 0  # this ending really ran drafted steps
    assert batch["live_states"] == 0


def test_each_ending_ends_where_it_should(endings):
    outs = [b["outputs"][0] for b in endings["batches"]]
    answer = SCRIPT.expected_output(thinking=False)
    assert outs[0] == FULL[:50]
    assert outs[1] == answer[: answer.index(V["a010"]) + 1]  # the stop id is kept in the output
    assert outs[2][:20] == answer[:20] and len(outs[2]) in (20, 21)  # cut at the stop string
    assert outs[3] == FULL
    assert len(outs[4]) == 80 and outs[4][:61] == answer  # ignore_eos: on past <|eos|>


def test_aborted_in_flight_requests_count_like_vllm(endings):
    storm = endings["abort_storm"]
    assert storm["aborted_in_flight"] > 20  # finished in the engine core while their step ran
    assert storm["aborted"] > 50 and storm["finished"] > 0
    assert phase_sums(storm["phases"]) == vllm_sums(storm)
    assert storm["live_states"] == 0

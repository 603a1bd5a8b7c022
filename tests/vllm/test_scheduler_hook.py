"""The scheduler hook's reading of a step's shape (what the cost model learns from)."""

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from dspark_dynamic.adapter.patches.scheduler import step_timing  # noqa: E402


@pytest.mark.parametrize(("scheduled", "drafts", "decode_only"), [
    ({"a": 3, "b": 1}, {"a": [7, 8]}, True),  # a verifies two drafts, b none
    ({"a": 1, "b": 1}, {}, True),
    ({"a": 3, "b": 5}, {"a": [7, 8]}, False),  # b prefills a chunk of five
    ({"a": 9}, {}, False),
    ({"a": 2, "b": 2}, {"a": [7], "b": [7]}, True),
])
def test_a_step_is_decode_only_when_every_request_runs_its_drafts_and_one_token(scheduled, drafts, decode_only):
    out = SimpleNamespace(num_scheduled_tokens=scheduled, scheduled_spec_decode_tokens=drafts, num_spec_tokens_to_schedule=2)
    step = step_timing(out, 0.004)
    assert step == (0.004, decode_only, len(scheduled), 2)
    assert step.decode_only is decode_only and step.num_requests == len(scheduled)

"""A step that verifies no draft is sampled by vLLM's plain sampler: the wrapper's decision on
the installed vLLM's own ``SpecDecodeMetadata`` (CPU tensors), and when it keeps vLLM's path."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.v1.spec_decode.metadata import SpecDecodeMetadata  # noqa: E402

from dspark_dynamic.adapter.patches.zero_draft_sampling import ATTR, _sample, plain_sampling_wanted  # noqa: E402


def metadata(num_draft_tokens):
    """vLLM's metadata for a step with these per-request draft counts."""
    return SpecDecodeMetadata.make_dummy([[7] * n for n in num_draft_tokens], device=torch.device("cpu"))


class Runner:
    def __init__(self, raw=None, async_scheduling=False):
        spec = SimpleNamespace(num_speculative_tokens=2)
        self.vllm_config = SimpleNamespace(speculative_config=spec,
                                           additional_config={} if raw is None else {"dspark_dynamic": raw})
        self.use_async_scheduling = async_scheduling


def test_zero_draft_steps_take_the_plain_branch_only_when_configured_and_synchronous():
    seen = []

    def original(self, logits, spec_decode_metadata):
        seen.append(spec_decode_metadata)
        return "sampled"

    sample = _sample(original)
    idle, drafting = metadata([0, 0, 0]), metadata([0, 2, 1])
    assert idle.max_spec_len == 0 and drafting.max_spec_len == 2

    runner = Runner(raw={})
    assert sample(runner, "logits", idle) == "sampled" and seen[-1] is None  # vLLM's plain branch
    assert runner.__dict__[ATTR] is True  # decided once per runner
    sample(runner, "logits", drafting)
    assert seen[-1] is drafting  # drafts to verify: the rejection sampler
    sample(runner, "logits", None)
    assert seen[-1] is None

    for kept in (Runner(), Runner(raw={}, async_scheduling=True)):  # not configured; async scheduling
        sample(kept, "logits", idle)
        assert seen[-1] is idle and kept.__dict__[ATTR] is False


def test_wanted_only_for_a_configured_synchronous_runner():
    assert plain_sampling_wanted(Runner(raw={"reasoning_depth": 0}))
    assert not plain_sampling_wanted(Runner())
    assert not plain_sampling_wanted(Runner(raw={}, async_scheduling=True))
    assert not plain_sampling_wanted(SimpleNamespace())  # an unknown runner keeps vLLM's path


def test_a_metadata_without_max_spec_len_keeps_vllms_path():
    seen = []
    sample = _sample(lambda self, logits, spec_decode_metadata: seen.append(spec_decode_metadata))
    unknown = SimpleNamespace(num_draft_tokens=[0])  # an unknown vLLM's metadata: no max_spec_len
    sample(Runner(raw={}), "logits", unknown)
    assert seen == [unknown]

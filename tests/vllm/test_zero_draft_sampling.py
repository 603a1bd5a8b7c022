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


def test_zero_draft_metadata_is_vllms_for_all_zero_draft_counts():
    """The written-out metadata equals what vLLM's ``_calc_spec_decode_metadata`` computes when no
    request has a draft: every field, value and dtype, on random batches (prefill chunks too)."""
    import numpy as np
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from dspark_dynamic.adapter.patches.zero_draft_sampling import _calc_spec_decode_metadata, zero_draft_metadata

    class Buffer:
        def __init__(self, t):
            self.gpu = t

    import inspect

    class FakeRunner:  # vLLM's own methods (unwrapped: another test may have applied the plugin's patches)
        device = torch.device("cpu")
        _get_cumsum_and_arange = inspect.unwrap(GPUModelRunner._get_cumsum_and_arange)
        _calc_spec_decode_metadata = inspect.unwrap(GPUModelRunner._calc_spec_decode_metadata)

        def __init__(self):
            self.arange_np = np.arange(4096, dtype=np.int64)
            self._arange_scratch = np.empty(4096, dtype=np.int64)
            self.input_ids = Buffer(torch.randint(0, 1000, (4096,), dtype=torch.int32))

    rng = np.random.default_rng(0)
    runner = FakeRunner()
    for _ in range(30):
        n = int(rng.integers(1, 9))
        scheduled = rng.integers(1, 40, size=n).astype(np.int32)
        cu = np.cumsum(scheduled, dtype=np.int32)
        zeros = np.zeros(n, dtype=np.int32)
        ours = zero_draft_metadata(runner, zeros, cu)
        theirs = runner._calc_spec_decode_metadata(zeros, cu)
        for field in ("draft_token_ids", "cu_num_draft_tokens", "cu_num_sampled_tokens", "target_logits_indices",
                      "bonus_logits_indices", "logits_indices"):
            a, b = getattr(ours, field), getattr(theirs, field)
            assert a.dtype == b.dtype and torch.equal(a, b), field
        assert ours.num_draft_tokens == theirs.num_draft_tokens and ours.max_spec_len == theirs.max_spec_len == 0
    # the wrapper: a configured synchronous runner gets the fast form; drafts keep vLLM's
    calls = []

    def original(self, num_draft_tokens, cu):
        calls.append(num_draft_tokens)
        return "vllm's"

    wrapped = _calc_spec_decode_metadata(original)
    runner.vllm_config = Runner(raw={}).vllm_config
    runner.use_async_scheduling = False
    cu = np.array([3, 7], dtype=np.int32)
    assert wrapped(runner, np.zeros(2, dtype=np.int32), cu).logits_indices.tolist() == [2, 6]
    assert wrapped(runner, np.array([0, 1], dtype=np.int32), cu) == "vllm's" and len(calls) == 1

"""An idle DFlash drafter writes only its context: the wrapper around the installed vLLM's
``DFlashProposer.propose``, on a proposer whose vLLM methods are recorded (the real engine runs
in tests/engine/test_parallel_drafter.py)."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from vllm.v1.spec_decode.dflash import DFlashProposer  # noqa: E402

from dspark_dynamic.adapter.patches import dflash_context  # noqa: E402
from dspark_dynamic.adapter.patches.dflash_context import ATTR, GUARD, PATCHES  # noqa: E402

CONFIGURED = {"dspark_dynamic": {"policy": "adaptive"}}


class Recorder:
    """What vLLM's first pass calls on a DFlash proposer, recorded (no model, no cache)."""

    def __init__(self, additional=CONFIGURED, dp=1, fail_at=None):
        self.vllm_config = SimpleNamespace(
            additional_config=additional,
            speculative_config=SimpleNamespace(num_speculative_tokens=2),
            parallel_config=SimpleNamespace(data_parallel_size=dp),
        )
        self.calls = []
        self.fail_at = fail_at
        self.num_speculative_tokens = 2
        self._last_draft_probs = "stale"
        recorder = self
        self.model = SimpleNamespace(combine_hidden_states=lambda h: recorder._call("combine", h * 2))

    def _call(self, name, result=None):
        self.calls.append(name)
        if name == self.fail_at:
            raise RuntimeError(f"{name} failed")
        return result

    def set_inputs_first_pass(self, **kwargs):
        self.first_pass = kwargs
        return self._call("set_inputs", (7, None, None))

    def build_model_inputs_first_pass(self, num_tokens, num_input_tokens, mm_embed_inputs):
        return self._call("context", ({}, num_tokens))


def vllm_propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                 next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                 mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):
    self.calls.append(f"vllm K={num_speculative_tokens}")
    return "vllm's drafts"


propose = PATCHES[0].build(vllm_propose)


def call(proposer, k):
    cad = SimpleNamespace(batch_size=lambda: 3)
    return propose(proposer, k, torch.arange(5), torch.arange(5), torch.ones(5, 4), torch.zeros(3, dtype=torch.int64),
                   None, cad, None)


def test_the_patch_targets_the_installed_dflash_proposer():
    assert PATCHES[0].problem() is None
    assert callable(DFlashProposer.propose)


def test_at_depth_0_only_the_context_is_written_and_no_drafts_come_back():
    proposer = Recorder()
    out = call(proposer, 0)
    assert proposer.calls == ["combine", "set_inputs", "context"]  # no forward: vLLM's propose never ran
    assert out.shape == (3, 0) and out.dtype == torch.int64  # what vLLM's K = 0 path returns
    assert proposer.num_speculative_tokens == 0 and proposer._last_draft_probs is None
    assert torch.equal(proposer.first_pass["target_hidden_states"], torch.full((5, 4), 2.0))  # combined
    assert proposer.__dict__[ATTR] is True


def test_drafting_steps_and_unconfigured_or_data_parallel_drafters_run_vllms_propose():
    proposer = Recorder()
    assert call(proposer, 2) == "vllm's drafts" and proposer.calls == ["vllm K=2"]
    for off in (Recorder(additional=None), Recorder(additional={"dspark_dynamic": {"skip_idle_drafter": False}}),
                Recorder(dp=2)):
        assert call(off, 0) == "vllm's drafts" and off.calls == ["vllm K=0"]
        assert off.__dict__[ATTR] is None
    assert dflash_context.why_not_context_only(Recorder(dp=2)).startswith("data parallel")


def test_a_fault_falls_back_to_vllms_propose_for_good():
    before = GUARD.errors
    proposer = Recorder(fail_at="context")
    assert call(proposer, 0) == "vllm's drafts"
    assert proposer.calls == ["combine", "set_inputs", "context", "vllm K=0"]
    assert GUARD.errors == before + 1 and proposer.__dict__[ATTR] is None
    proposer.calls.clear()
    assert call(proposer, 0) == "vllm's drafts" and proposer.calls == ["vllm K=0"]


def test_vllms_own_errors_pass_through_once_and_leave_the_plugin_attached():
    def failing(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):
        self.calls.append(f"vllm K={num_speculative_tokens}")
        raise ValueError("vLLM's own error")

    wrapped = PATCHES[0].build(failing)
    proposer, before = Recorder(), GUARD.errors
    cad = SimpleNamespace(batch_size=lambda: 3)
    with pytest.raises(ValueError, match="vLLM's own error"):
        wrapped(proposer, 2, torch.arange(5), torch.arange(5), torch.ones(5, 4), torch.zeros(3, dtype=torch.int64),
                None, cad, None)
    assert proposer.calls == ["vllm K=2"] and GUARD.errors == before

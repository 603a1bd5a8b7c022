"""Record every proposal a Model Runner V1 drafter returns (tests; in-process engines only).

``install()`` wraps ``GPUModelRunner.propose_draft_token_ids``: each non-empty proposal is kept
as ``[request number, query start position, draft ids]`` rows (request number: order of first
appearance, stable across engines fed the same prompts); ``report()`` returns them with the
drafter's idle-skip counters, and how many steps vLLM's rejection sampler verified, by the
step's deepest draft (``max_spec_len``).  For a DFlash drafter it also keeps every context write
(``[positions, slots, sum of the context states]`` per call) and counts the drafter's forwards
(its attention metadata is built once per forward).  It counts the steps sampled with the
runner's speculative config off (``plain_step``), and the steps that began with it still off.
"""

from __future__ import annotations

import functools
from typing import Any

_proposals: list[list[list[Any]]] = []
_numbers: dict[str, int] = {}
_skip_state: Any = None
_rejection_steps: dict[int, int] = {}
_contexts: list[list[Any]] = []
_forwards = [0]
_plain = {"steps": 0, "left_off": 0}


def install() -> None:
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from dspark_dynamic.adapter.patches.drafter_skip import ATTR

    original = GPUModelRunner.propose_draft_token_ids

    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any) -> Any:
        global _skip_state
        out = original(self, *args, **kwargs)
        if isinstance(out, torch.Tensor) and out.numel():
            n = out.shape[0]
            ids = self.input_batch.req_ids[:n]
            starts = self.input_batch.num_computed_tokens_cpu[:n].tolist()
            rows = [[_numbers.setdefault(ids[i], len(_numbers)), starts[i], row] for i, row in enumerate(out.tolist())]
            _proposals.append(rows)
        if hasattr(self, "drafter"):
            _skip_state = self.drafter.__dict__.get(ATTR) or _skip_state
        return out

    GPUModelRunner.propose_draft_token_ids = propose_draft_token_ids

    from vllm.v1.sample.rejection_sampler import RejectionSampler

    verify = RejectionSampler.forward

    @functools.wraps(verify)
    def forward(self: Any, metadata: Any, *args: Any, **kwargs: Any) -> Any:
        _rejection_steps[metadata.max_spec_len] = _rejection_steps.get(metadata.max_spec_len, 0) + 1
        return verify(self, metadata, *args, **kwargs)

    RejectionSampler.forward = forward
    sample, execute = GPUModelRunner.sample_tokens, GPUModelRunner.execute_model

    @functools.wraps(sample)
    def sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.execute_model_state is not None and self.speculative_config is None:
            _plain["steps"] += 1
        return sample(self, *args, **kwargs)

    @functools.wraps(execute)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        if hasattr(self, "drafter"):  # a speculative runner: a step before this one did not restore it
            _plain["left_off"] += self.speculative_config is None
        return execute(self, *args, **kwargs)

    GPUModelRunner.execute_model = execute_model
    GPUModelRunner.sample_tokens = sample_tokens
    _install_dflash()


def _install_dflash() -> None:
    try:
        from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM
        from vllm.v1.spec_decode.dflash import DFlashProposer
    except ImportError:
        return
    store = DFlashQwen3ForCausalLM.precompute_and_store_context_kv

    @functools.wraps(store)
    def precompute_and_store_context_kv(self: Any, states: Any, positions: Any, slots: Any = None) -> Any:
        _contexts.append([positions.tolist(), None if slots is None else slots.tolist(), float(states.float().sum())])
        return store(self, states, positions, slots)

    DFlashQwen3ForCausalLM.precompute_and_store_context_kv = precompute_and_store_context_kv
    metadata = DFlashProposer.build_per_group_and_layer_attn_metadata

    @functools.wraps(metadata)
    def build_per_group_and_layer_attn_metadata(self: Any, *args: Any, **kwargs: Any) -> Any:
        _forwards[0] += 1
        return metadata(self, *args, **kwargs)

    DFlashProposer.build_per_group_and_layer_attn_metadata = build_per_group_and_layer_attn_metadata


def report() -> dict[str, Any]:
    state = _skip_state
    skip = None if state is None else {"skipped_steps": state.lag.skipped_steps,
                                       "caught_up_positions": state.lag.caught_up_positions,
                                       "lost_positions": state.lost_positions}
    return {"proposals": _proposals, "skip": skip, "rejection_steps": dict(_rejection_steps),
            "dflash_contexts": _contexts, "dflash_forwards": _forwards[0], "plain_steps": dict(_plain)}

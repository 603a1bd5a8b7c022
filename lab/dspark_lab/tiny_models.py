"""Tiny Llama models whose greedy output follows a fixed reasoning/answer script.

The target is a "bigram" model: its single decoder layer writes nothing into the residual
stream (o_proj and down_proj are zero), so the logits depend only on the current token:
``logits = lm_head(rmsnorm(embed(x)))``.  ``lm_head`` row ``s`` is the unit embedding of the
token whose successor is ``s``, so greedy decoding walks the chain

    ... <think> r000 r001 ... r{R-1} </think> a000 ... a{A-1} <|eos|>

from any prompt that ends in ``<think>`` (reasoning, then answer) or ``</think>`` (answer only).
Draft models share the tokenizer: the *oracle* draft has the target's weights (100 %
acceptance); a *phase* draft predicts the right successor for a seeded fraction of reasoning
transitions and of answer transitions, and a wrong (filler) token otherwise.

Models are written once into a content-addressed directory (``DSPARK_DYNAMIC_MODEL_CACHE`` or
``~/.cache/tiny-phase-models``) and reused.  The path must not contain "dspark", "eagle" or
"dflash": vLLM picks the speculative method from those words in a draft model's path, even when
``method`` is given.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

BUILDER_VERSION = 2
HIDDEN = 128
HEAD_DIM = 64  # a head size the vLLM CPU attention backend accepts
VOCAB_SIZE = 256
SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<unk>", "<|user|>", "<|assistant|>"]
THINK_START = "<think>"
THINK_END = "</think>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|user|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> "
    "{% if enable_thinking is defined and not enable_thinking %}</think>{% else %}<think>{% endif %}"
    "{% endif %}"
)


@dataclass(frozen=True)
class Script:
    reasoning_len: int = 120
    answer_len: int = 60

    @property
    def num_fillers(self) -> int:
        n = VOCAB_SIZE - len(SPECIALS) - 2 - self.reasoning_len - self.answer_len
        if n < 8:
            raise ValueError("script too long for the tiny vocabulary")
        return n

    def words(self) -> list[str]:
        return (
            SPECIALS
            + [THINK_START, THINK_END]
            + [f"r{i:03d}" for i in range(self.reasoning_len)]
            + [f"a{i:03d}" for i in range(self.answer_len)]
            + [f"f{i:03d}" for i in range(self.num_fillers)]
        )

    def vocab(self) -> dict[str, int]:
        return {w: i for i, w in enumerate(self.words())}

    def reasoning_ids(self) -> list[int]:
        v = self.vocab()
        return [v[f"r{i:03d}"] for i in range(self.reasoning_len)]

    def answer_ids(self) -> list[int]:
        v = self.vocab()
        return [v[f"a{i:03d}"] for i in range(self.answer_len)]

    def filler_ids(self) -> list[int]:
        v = self.vocab()
        return [v[f"f{i:03d}"] for i in range(self.num_fillers)]

    def successor(self) -> dict[int, int]:
        """The target's greedy transition table (only chain tokens have a defined successor)."""
        v = self.vocab()
        chain = [v[THINK_START]] + self.reasoning_ids() + [v[THINK_END]] + self.answer_ids() + [v["<|eos|>"]]
        return {a: b for a, b in zip(chain, chain[1:])}

    def expected_output(self, thinking: bool = True) -> list[int]:
        """Greedy output ids after a prompt ending in <think> (thinking) or </think>."""
        v = self.vocab()
        out = self.answer_ids() + [v["<|eos|>"]]
        if thinking:
            out = self.reasoning_ids() + [v[THINK_END]] + out
        return out

    def reasoning_transitions(self) -> list[int]:
        v = self.vocab()
        return [v[THINK_START]] + self.reasoning_ids()[:-1]

    def answer_transitions(self) -> list[int]:
        v = self.vocab()
        return [self.reasoning_ids()[-1], v[THINK_END]] + self.answer_ids()


_METHOD_WORDS = ("dspark", "eagle", "dflash")


def cache_root() -> Path:
    env = os.environ.get("DSPARK_DYNAMIC_MODEL_CACHE")
    root = Path(env) if env else Path.home() / ".cache" / "tiny-phase-models"
    bad = [w for w in _METHOD_WORDS if w in str(root).lower()]
    if bad:
        raise ValueError(
            f"model cache path {str(root)!r} contains {bad[0]!r}; vLLM would take a draft model "
            "there for that speculative method. Choose another DSPARK_DYNAMIC_MODEL_CACHE."
        )
    return root


def _write_tokenizer(out: Path, script: Script) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, decoders

    tok = Tokenizer(models.WordLevel(vocab=script.vocab(), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # scripts may bring their own marker tokens, and decode without spaces (markers spelled as
    # one string, e.g. harmony's "<|channel|>final<|message|>", then round-trip)
    fuse = getattr(script, "fuse_decoding", False)
    tok.decoder = decoders.Fuse() if fuse else decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    added = getattr(script, "added_tokens", (THINK_START, THINK_END))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|bos|>",
                "eos_token": "<|eos|>",
                "pad_token": "<|pad|>",
                "unk_token": "<unk>",
                "add_bos_token": False,
                "model_max_length": 1024,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=1,
        )
    )


CHAIN_LOGIT = 30.0  # a successor's logit


def chain_tensors(transitions: dict[int, int] | list[tuple], seed: int, hidden: int = HIDDEN,
                  orthogonal: bool = False) -> tuple[dict, "object"]:
    """Embedding, final norm and lm_head of a chain model, plus the generator for the rest.

    ``transitions``: source -> successor, or (source, successor) pairs, or (source, successor,
    weight) triples; a source with several successors gives each the same logit (a fair
    branch), or ``weight * 30``.  A successor's logit is 30, every other one |cos| * 30 <~ 11:
    even temperature-1 sampling follows the transitions (a token that is no successor has
    probability < 1e-6 per step).  ``orthogonal`` (needs ``hidden >= VOCAB_SIZE``): orthonormal
    embeddings, so every logit is exactly its designed value (no cross-talk between tokens).
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(VOCAB_SIZE, hidden, generator=g)
    if orthogonal:
        embed = torch.linalg.qr(torch.randn(hidden, hidden, generator=g))[0][:VOCAB_SIZE] * hidden**0.5
    unit = embed / embed.norm(dim=1, keepdim=True)
    scale = CHAIN_LOGIT / hidden**0.5
    lm_head = torch.zeros(VOCAB_SIZE, hidden)
    pairs = transitions.items() if isinstance(transitions, dict) else transitions
    for src, dst, *weight in pairs:
        lm_head[dst] += unit[src] * scale * (weight[0] if weight else 1.0)
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(hidden), "lm_head.weight": lm_head}
    return tensors, g


def silent_attention(layer: int, g, hidden: int = HIDDEN) -> dict:
    """One decoder layer's attention and norms; ``o_proj`` is zero, so it adds nothing."""
    import torch

    small = lambda *shape: torch.randn(*shape, generator=g) * 0.02  # noqa: E731
    p = f"model.layers.{layer}."
    return {
        p + "self_attn.q_proj.weight": small(hidden, hidden),
        p + "self_attn.k_proj.weight": small(hidden, hidden),
        p + "self_attn.v_proj.weight": small(hidden, hidden),
        p + "self_attn.o_proj.weight": torch.zeros(hidden, hidden),
        p + "input_layernorm.weight": torch.ones(hidden),
        p + "post_attention_layernorm.weight": torch.ones(hidden),
    }


def save_model(out: Path, tensors: dict, config: dict) -> None:
    import torch
    from safetensors.torch import save_file

    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))


def base_config(architecture: str, model_type: str, layers: int, hidden: int = HIDDEN) -> dict:
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": VOCAB_SIZE,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": hidden // HEAD_DIM,
        "num_key_value_heads": hidden // HEAD_DIM,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "torch_dtype": "bfloat16",
    }


def _write_model(out: Path, transitions: dict[int, int] | list[tuple], seed: int, hidden: int = HIDDEN,
                 orthogonal: bool = False, loud_attention: bool = False) -> None:
    """A 1-layer Llama: attention and MLP write nothing (o_proj, down_proj zero).

    ``loud_attention``: the attention speaks instead, so every earlier position's value reaches
    the logits and what the model predicts depends on its whole KV cache, not only on the last
    token."""
    import torch

    tensors, g = chain_tensors(transitions, seed, hidden, orthogonal)
    tensors.update(silent_attention(0, g, hidden))
    if loud_attention:
        p = "model.layers.0.self_attn."
        for name, scale in (("q_proj", 0.3), ("k_proj", 0.3), ("v_proj", 0.15), ("o_proj", 0.15)):
            tensors[f"{p}{name}.weight"] = torch.randn(hidden, hidden, generator=g) * scale
    inter = hidden
    tensors["model.layers.0.mlp.gate_proj.weight"] = torch.randn(inter, hidden, generator=g) * 0.02
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.randn(inter, hidden, generator=g) * 0.02
    tensors["model.layers.0.mlp.down_proj.weight"] = torch.zeros(hidden, inter)
    save_model(out, tensors, {**base_config("LlamaForCausalLM", "llama", 1, hidden), "intermediate_size": inter})


def build_cached(kind: str, spec: dict, script: Script, write: Callable[[Path], None]) -> Path:
    """Build a model once into the content-addressed cache (``write(tmpdir)`` writes its weights)."""

    def write_all(out: Path) -> None:
        _write_tokenizer(out, script)
        write(out)

    return cached_dir(kind, spec, write_all)


def cached_dir(kind: str, spec: dict, write: Callable[[Path], None]) -> Path:
    """A model directory written once into the content-addressed cache: ``write(tmpdir)`` writes
    every file; the directory appears complete (one rename) or not at all."""
    key = hashlib.sha256(json.dumps({"v": BUILDER_VERSION, "kind": kind, **spec}, sort_keys=True).encode())
    target = cache_root() / f"{kind}-{key.hexdigest()[:12]}"
    if (target / "model.safetensors").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=target.parent))
    try:
        write(tmp)
        (tmp / "dspark_dynamic_tiny.json").write_text(json.dumps({"kind": kind, **spec}, indent=1))
        try:
            tmp.rename(target)
        except OSError:  # built concurrently by another process: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def build_target(script: Script = Script()) -> Path:
    """The deterministic target (also the oracle draft: identical weights)."""
    return build_cached("target", {"script": asdict(script), "seed": 0}, script,
                        lambda out: _write_model(out, script.successor(), seed=0))


def build_context_draft(script: Script = Script()) -> Path:
    """A draft for ``build_target`` whose drafts depend on its KV cache (a hole in the cache
    changes them): the chain model plus a loud attention layer."""
    return build_cached("context-draft", {"script": asdict(script), "seed": 3}, script,
                        lambda out: _write_model(out, script.successor(), seed=3, loud_attention=True))


def phase_draft_transitions(
    script: Script, reasoning_hit: float, answer_hit: float, seed: int
) -> dict[int, int]:
    import random

    rng = random.Random(seed)
    right = script.successor()
    fillers = script.filler_ids()
    table = dict(right)
    for hit, sources in ((reasoning_hit, script.reasoning_transitions()), (answer_hit, script.answer_transitions())):
        for src in sources:
            if rng.random() >= hit:
                table[src] = fillers[rng.randrange(len(fillers))]
    return table


@dataclass(frozen=True)
class DraftConfidence:
    """How sure a phase draft is of each transition: the gap (in logits) between its choice and
    a runner-up, drawn per transition from Normal(``right``, ``spread``) where the choice is the
    script's successor and Normal(``wrong``, ``spread``) where it is not (at least ``floor``,
    so the choice stays the argmax).  The gap is about the log-odds of the draft's maximum
    probability: peaked where right, flatter where wrong, overlapping (ROC-AUC ~0.85)."""

    right: float = 4.2
    wrong: float = 2.0
    spread: float = 1.5
    floor: float = 0.2
    seed: int = 11


def confidence_gaps(script: Script, table: dict[int, int], confidence: DraftConfidence) -> dict[int, float]:
    """Per source token of ``table``: the logit gap between the draft's choice and its runner-up."""
    import random

    rng = random.Random(confidence.seed)
    right = script.successor()
    return {
        src: max(confidence.floor, rng.gauss(confidence.right if dst == right.get(src) else confidence.wrong,
                                             confidence.spread))
        for src, dst in sorted(table.items())
    }


def confidence_auc(script: Script, table: dict[int, int], gaps: dict[int, float],
                   sources: list[int] | None = None) -> float:
    """ROC-AUC of the gaps as a score of 'the draft is right', over ``sources`` (default: all)."""
    right = script.successor()
    srcs = sources if sources is not None else sorted(gaps)
    pos = [gaps[s] for s in srcs if table[s] == right.get(s)]
    neg = [gaps[s] for s in srcs if table[s] != right.get(s)]
    if not pos or not neg:
        return float("nan")
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


def _write_confident_model(out: Path, script: Script, table: dict[int, int], gaps: dict[int, float]) -> None:
    """The chain model of ``table`` whose choice at ``src`` leads a runner-up by ``gaps[src]``
    logits: the script's successor where the choice is wrong, the successor's successor (else a
    filler) where it is right.  Orthonormal embeddings (hidden = vocabulary size) keep every
    other logit at 0, so the log-odds of the maximum probability is the gap."""
    right = script.successor()
    fillers = script.filler_ids()
    pairs: list[tuple[int, int, float]] = []
    for i, (src, dst) in enumerate(sorted(table.items())):
        if dst != right.get(src) and src in right:
            runner = right[src]
        else:
            runner = right.get(dst, fillers[i % len(fillers)])
        pairs.append((src, dst, 1.0))
        pairs.append((src, runner, 1.0 - gaps[src] / CHAIN_LOGIT))
    _write_model(out, pairs, seed=0, hidden=VOCAB_SIZE, orthogonal=True)


def drift_draft_transitions(script: Script, answer_hit: float, seed: int) -> dict[int, int]:
    """Right on every transition of the first half of reasoning, wrong (a filler) on every one
    of the second half, right on ~``answer_hit`` of the answer's."""
    table = phase_draft_transitions(script, 1.0, answer_hit, seed)
    fillers = script.filler_ids()
    reasoning = script.reasoning_transitions()
    for i, src in enumerate(reasoning[len(reasoning) // 2:]):
        table[src] = fillers[i % len(fillers)]
    return table


def build_drift_draft(script: Script = Script(), answer_hit: float = 0.949, seed: int = 4, gap: float = 3.0) -> Path:
    """A draft whose acceptance drops from all to none halfway through reasoning, and whose
    confidence says nothing of it: the same logit gap ``gap`` (maximum probability about
    ``sigmoid(gap)``) whether it is right or wrong (an overconfident drafter)."""
    table = drift_draft_transitions(script, answer_hit, seed)
    gaps = {src: gap for src in table}
    spec = {"script": asdict(script), "answer_hit": answer_hit, "seed": seed, "gap": gap}
    return build_cached("drift-draft", spec, script, lambda out: _write_confident_model(out, script, table, gaps))


def build_phase_draft(
    script: Script = Script(), reasoning_hit: float = 0.4, answer_hit: float = 0.9, seed: int = 1,
    confidence: DraftConfidence | None = None,
) -> Path:
    """A draft right on ~``reasoning_hit`` of reasoning steps and ~``answer_hit`` of answer steps;
    with ``confidence``, its distribution says how sure it is (see ``DraftConfidence``)."""
    spec = {"script": asdict(script), "reasoning_hit": reasoning_hit, "answer_hit": answer_hit, "seed": 0, "draft_seed": seed}
    table = phase_draft_transitions(script, reasoning_hit, answer_hit, seed)
    if confidence is None:
        return build_cached("phase-draft", spec, script, lambda out: _write_model(out, table, seed=0))
    gaps = confidence_gaps(script, table, confidence)
    spec["confidence"] = asdict(confidence)
    return build_cached("phase-draft", spec, script, lambda out: _write_confident_model(out, script, table, gaps))


def prompt_ids(script: Script = Script(), thinking: bool = True, words: int = 6) -> list[int]:
    """A chat prompt as token ids: user fillers, then <|assistant|> and <think> or </think>."""
    v = script.vocab()
    fill = script.filler_ids()[:words]
    return [v["<|user|>"], *fill, v["<|assistant|>"], v[THINK_START] if thinking else v[THINK_END]]

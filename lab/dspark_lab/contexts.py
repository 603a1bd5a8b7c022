"""Request contexts for the wall-clock benchmarks: short, long, or both in one batch.

``bench_wallclock.py --context short|long|mixed`` (testbed and real checkpoint alike):

- ``short``: the benchmarks' usual prompts (the testbed's script prompt, the real checkpoint's
  ``real_checkpoint.PROMPTS``), the engines' usual settings: today's runs, unchanged;
- ``long``: every request's prompt holds a document of at least ``LONG_TOKENS`` tokens of real
  text (license texts of the environment, ``long_text``), then the usual task;
- ``mixed``: short (a ``SHORT_TOKENS``-token document, then the task) and long requests in flight
  together: slot ``s`` of the closed loop is short for even ``s`` and long for odd ``s``
  (``slot_classes``), and a finished request is replaced by one of its own slot's class, so at
  concurrency 2 one short and one long request run at once, at 4 two of each.  Concurrency 1 is
  refused (one request in flight cannot mix).

Prompts: ``testbed_prompts`` (the testbed's word-level vocabulary: one token per word, each word
a filler token) and ``real_prompts`` (a chat prompt through the checkpoint's template: the
document, then a copy or an explain task, ``TASKS``); documents are counted in the target's
tokens.

Each class has ``DOCUMENTS`` documents, sent in rotation (``slot_queues``): a small fixed set, so
that with prefix caching on (``ENGINE``) each engine prefills each document once, in a priming
pass before the rounds, and the comparison holds decode steps only.  The engines of a long or
mixed run get ``MAX_MODEL_LEN`` and targets and drafts whose position tables reach it
(``long_context_copy``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dspark_lab.long_text import build_documents

CONTEXTS = ("short", "long", "mixed")
CLASSES = ("short", "long")
LONG_TOKENS = 4096  # a long request's document, at least (tokens of the target's tokenizer)
SHORT_TOKENS = 200  # a short request's document in a mixed run, at least
DOCUMENTS = 3  # documents per class, rotated over rounds
MAX_MODEL_LEN = 8192  # a long prompt (~4.1-4.7k tokens) and its output fit
# Engine settings of long and mixed runs (beside each benchmark's own): prefix caching on, so
# every engine's prefill of a document is out of the comparison after its first time.
ENGINE = {"max_model_len": MAX_MODEL_LEN, "enable_prefix_caching": True}
# Documents of the short class start half-way between the long ones: no short document is the
# start of a long one, so neither class reads the other's cached prefix.
SHORT_OFFSET = 0.5


def slot_classes(context: str, concurrency: int) -> tuple[str, ...]:
    """The class of each slot of the closed loop: every slot ``short`` or ``long`` for those
    contexts; ``mixed`` alternates short (even slots) and long (odd slots)."""
    if context not in CONTEXTS:
        raise ValueError(f"unknown context {context!r}; one of {', '.join(CONTEXTS)}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1; got {concurrency}")
    if context == "mixed":
        if concurrency < 2:
            raise ValueError("--context mixed needs --concurrency 2 or more: short and long requests in flight "
                             "together (at 2 one of each, at 4 two of each); concurrency 1 cannot mix them")
        return tuple(CLASSES[s % 2] for s in range(concurrency))
    return (context,) * concurrency


def slot_queues(classes: tuple[str, ...], prompts: dict[str, list[Any]], turn: int, per_slot: int) -> list[list[Any]]:
    """Each slot's queue for one turn: ``per_slot`` prompts of the slot's class, in rotation over
    turns; slots of the same class start at different documents (while there are enough)."""
    rank = {s: sum(1 for t in range(s) if classes[t] == c) for s, c in enumerate(classes)}
    out = []
    for s, c in enumerate(classes):
        docs = prompts[c]
        out.append([docs[(turn * per_slot + i + rank[s]) % len(docs)] for i in range(per_slot)])
    return out


def documents(count_tokens: Callable[[str], int], classes: tuple[str, ...],
              count: int = DOCUMENTS) -> dict[str, list[str]]:
    """``count`` documents for each class in ``classes`` (short: ``SHORT_TOKENS``, long:
    ``LONG_TOKENS``), counted by ``count_tokens`` (the target's tokenizer)."""
    sizes = {"short": (SHORT_TOKENS, SHORT_OFFSET), "long": (LONG_TOKENS, 0.0)}
    return {c: build_documents(count, sizes[c][0], count_tokens, offset=sizes[c][1]) for c in dict.fromkeys(classes)}


def lengths(prompts: dict[str, list[list[int]]]) -> str:
    """Prompt lengths in tokens per class: ``long 4310/4322/4388`` (min/median/max)."""
    return ", ".join(f"{c} {min(map(len, p))}/{int(statistics.median(map(len, p)))}/{max(map(len, p))}"
                     for c, p in prompts.items())


def check_fits(prompts: dict[str, list[list[int]]], max_tokens: int, max_model_len: int = MAX_MODEL_LEN) -> None:
    """Every prompt and its output fit the engines' ``max_model_len`` (else a clear error)."""
    longest = max(len(p) for ps in prompts.values() for p in ps)
    if longest + max_tokens > max_model_len:
        raise ValueError(f"a prompt of {longest} tokens and {max_tokens} output tokens exceed "
                         f"max_model_len {max_model_len}")


def prefix_caching_line(info: dict[str, dict[str, Any]]) -> str:
    """What the engines said of prefix caching (as vLLM resolved it), for the report header."""
    values = {name: i.get("prefix_caching") for name, i in info.items() if not name.startswith("(ballast")}
    if values and all(v is True for v in values.values()):
        return "prefix caching: on in every engine"
    if values and all(v is False for v in values.values()):
        return "prefix caching: off in every engine"
    return "prefix caching: " + ", ".join(f"{n} {v}" for n, v in values.items())


def prime(pool: Any, names: Sequence[str], prompts: dict[str, list[list[int]]], log: Any = print,
          start_phase: str = "reasoning") -> dict[str, dict[str, float]]:
    """Every engine ``names`` of ``pool`` (an ``EnginePool``) prefills every prompt once (one
    output token each, one request at a time), so the rounds find them in its prefix cache;
    returns each engine's prefix-cache counters after it (``add_prefix_hits`` subtracts them)."""
    every = [p for ps in prompts.values() for p in ps]
    log(f"priming {len(names)} engines with {len(every)} prompts each ...")
    for name in names:
        pool.run(name, None, 1, -1, start_phase=start_phase, slots=[every])
    return {name: pool.counters(name)["prefix_cache"] for name in names}


def add_prefix_hits(pool: Any, names: Sequence[str], primed: dict[str, dict[str, float]], into: dict[str, Any]) -> None:
    """Adds to ``into["prefix_cache"]`` each engine's prompt tokens found cached and looked up
    since ``primed`` (summed over epochs), and sets ``into["prefix_cache_hit_rate"]``."""
    counts = into.setdefault("prefix_cache", {})
    for name in names:
        now = pool.counters(name)["prefix_cache"]
        hits, queries = counts.get(name, (0.0, 0.0))
        counts[name] = (hits + now["hits"] - primed[name]["hits"], queries + now["queries"] - primed[name]["queries"])
    into["prefix_cache_hit_rate"] = {n: h / q for n, (h, q) in counts.items() if q}


def long_context_copy(model: Path | str, max_positions: int = MAX_MODEL_LEN) -> Path:
    """``model`` with its position table raised to ``max_positions`` (``config.json``'s
    ``max_position_embeddings``; the tokenizer's ``model_max_length`` too), cached beside it;
    weights are hard links (a copy where links fail).  The tiny models' tables stop at 1,024
    positions, short of a long prompt; RoPE works at any position, so nothing else changes."""
    from dspark_lab.tiny_models import cached_dir

    source = Path(model)
    config = json.loads((source / "config.json").read_text())
    if config.get("max_position_embeddings", 0) >= max_positions:
        return source

    def write(out: Path) -> None:
        for item in sorted(source.iterdir()):
            if item.name == "dspark_dynamic_tiny.json" or not item.is_file():
                continue
            if item.name == "config.json":
                (out / item.name).write_text(json.dumps({**config, "max_position_embeddings": max_positions}, indent=1))
            elif item.name == "tokenizer_config.json":
                tok = json.loads(item.read_text())
                (out / item.name).write_text(json.dumps({**tok, "model_max_length": max_positions}, indent=1))
            else:
                try:
                    os.link(item, out / item.name)
                except OSError:
                    shutil.copy2(item, out / item.name)

    return cached_dir("long-context", {"source": source.name, "max_positions": max_positions}, write)


def testbed_words(script: Any, text: str) -> list[int]:
    """``text`` as testbed token ids: one token per whitespace-separated word, as the testbed's
    word-level tokenizer splits it.  Its vocabulary holds no English (every word would be
    ``<unk>``, and every document the same), so each word is a filler token chosen by a stable
    hash of the word: documents keep their own token sequences (a prefix cache tells them
    apart), and no chain or marker token ever appears in a document."""
    import zlib

    fillers = script.filler_ids()
    return [fillers[zlib.crc32(word.encode()) % len(fillers)] for word in text.split()]


def testbed_prompts(script: Any, classes: tuple[str, ...], count: int = DOCUMENTS) -> dict[str, list[list[int]]]:
    """Per class, ``count`` thinking-mode prompts: ``<|user|>``, a document, the script prompt's
    own user words, ``<|assistant|> <think>`` (greedy output is the script's, whatever the
    document: the target's next token depends on its last one only)."""
    from dspark_lab.tiny_models import prompt_ids

    task = prompt_ids(script, thinking=True)  # <|user|> fillers <|assistant|> <think>
    docs = documents(lambda text: len(text.split()), classes, count)
    return {c: [task[:1] + testbed_words(script, d) + task[1:] for d in ds] for c, ds in docs.items()}


# Tasks after a long or mixed context's documents, in rotation: a copy (prompt lookup finds the
# answer in the prompt) and an explanation (it mostly does not).
TASKS = ("Copy the first paragraph of the text above exactly, word for word.",
         "Explain in a few sentences what the text above allows, and what it asks in return.")


def real_prompts(target: str, classes: tuple[str, ...]) -> dict[str, list[list[int]]]:
    """Per class, ``DOCUMENTS`` chat prompts: a document (counted by the target's
    tokenizer), a blank line and a task of ``TASKS``."""
    from transformers import AutoTokenizer

    from dspark_lab.real_checkpoint import chat_prompt_ids

    tokenizer = AutoTokenizer.from_pretrained(target)
    docs = documents(lambda text: len(tokenizer.encode(text, add_special_tokens=False)), classes)
    return {c: [chat_prompt_ids(target, f"{d}\n\n{TASKS[j % len(TASKS)]}") for j, d in enumerate(ds)]
            for c, ds in docs.items()}


def real_kv_bytes(target: str, prompts: dict[str, list[list[int]]], concurrency: int, max_tokens: int) -> int:
    """A KV cache (bytes, whole MiB) that holds every prompt at once (prefix caching keeps them
    all), the outputs in flight and a margin, in the target's float32 K and V."""
    cfg = json.loads((Path(target) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * head_dim * 4
    tokens = sum(len(p) for ps in prompts.values() for p in ps) + concurrency * (max_tokens + 256) + 2048
    return math.ceil(per_token * tokens / (1 << 20)) << 20

"""A fair-branch model and the statistics that check sampling under speculative decoding.

The model (a tiny Llama built locally, the script's tokenizer) walks ``X`` -> ``A`` or ``B``
with probability 1/2 each, then back to ``X``: ``X A X B X B X A ...``.  Its greedy choice at a
branch is a tie, so only sampling is meaningful.  A prompt that repeats ``X A`` lets ngram drafting
propose the ``A`` branch as often as it can.  Under a lossless verifier the branches of a sample
are independent fair coins whatever was drafted; ``branch_pattern`` reads them and
``chi_square_uniform`` tests the pattern counts against the uniform distribution.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from dspark_lab.tiny_models import Script, _write_model, build_cached

SCRIPT = Script()
_V = SCRIPT.vocab()
X, A, B = _V["f000"], _V["f001"], _V["f002"]
THINK_START, THINK_END = _V["<think>"], _V["</think>"]
BRANCHES = 4  # branch points per sample: outputs of 2 * BRANCHES tokens
# Critical values of the chi-square distribution at p = 0.001 (upper tail), by degrees of freedom.
CHI2_CRITICAL_0001 = {1: 10.828, 3: 16.266, 7: 24.322, 15: 37.697}


def branch_transitions() -> list[tuple[int, int]]:
    return [(X, A), (X, B), (A, X), (B, X), (THINK_START, X), (THINK_END, X)]


def build_branch_model(script: Script = SCRIPT) -> Path:
    pairs = branch_transitions()
    return build_cached("branch", {"script": {"r": script.reasoning_len, "a": script.answer_len}, "seed": 0,
                                   "pairs": pairs}, script, lambda out: _write_model(out, pairs, seed=0))


def branch_prompt(thinking: bool, repeats: int = 8) -> list[int]:
    """``<|user|> (X A)*repeats <|assistant|> <think>|</think> X``: ngram drafts ``A X A ...``."""
    return [_V["<|user|>"], *([X, A] * repeats), _V["<|assistant|>"], THINK_START if thinking else THINK_END, X]


def branch_pattern(output: Sequence[int], branches: int = BRANCHES) -> tuple[int, ...] | None:
    """The branch taken (1 = A, 0 = B) at each of the first ``branches`` branch points, or None
    when the output leaves the model's walk (which a lossless verifier never makes it do)."""
    if len(output) < 2 * branches - 1:
        return None
    pattern = []
    for i in range(branches):
        token = output[2 * i]
        if token not in (A, B) or (2 * i + 1 < len(output) and output[2 * i + 1] != X):
            return None
        pattern.append(1 if token == A else 0)
    return tuple(pattern)


def chi_square_uniform(patterns: Iterable[tuple[int, ...]], branches: int = BRANCHES) -> tuple[float, int]:
    """Pearson's statistic of the pattern counts against uniform, and its degrees of freedom."""
    counts = Counter(patterns)
    n = sum(counts.values())
    cells = 2**branches
    expected = n / cells
    stat = 0.0
    for code in range(cells):
        pattern = tuple((code >> (branches - 1 - b)) & 1 for b in range(branches))
        stat += (counts.get(pattern, 0) - expected) ** 2 / expected
    return stat, cells - 1

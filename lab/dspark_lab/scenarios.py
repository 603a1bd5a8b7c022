"""Request batches shared by the engine tests, the demo and the engine benchmark.

Every run uses the same batches in the same order, so reports line up batch by batch.
"""

from __future__ import annotations

from dspark_lab.tiny_models import Script, prompt_ids

SCRIPT = Script()
THINKING_PROMPT = prompt_ids(SCRIPT, thinking=True)
ANSWER_PROMPT = prompt_ids(SCRIPT, thinking=False)
# Quotes pieces of the script, so prompt-lookup (ngram) drafting finds matches while generating.
_v = SCRIPT.vocab()
NGRAM_PROMPT = (
    [_v["<|user|>"]]
    + SCRIPT.reasoning_ids()[:50]
    + SCRIPT.filler_ids()[:3]
    + SCRIPT.answer_ids()[10:40]
    + [_v["<|assistant|>"], _v["<think>"]]
)

REASONING_ONLY, ANSWER_ONLY, FULL, NGRAM = range(4)
REASONING_ONLY_TOKENS = 90  # < SCRIPT.reasoning_len: the batch never leaves reasoning

BATCHES = [
    [{"prompt_ids": THINKING_PROMPT, "max_tokens": REASONING_ONLY_TOKENS}],
    [{"prompt_ids": ANSWER_PROMPT, "max_tokens": 300}],
    [{"prompt_ids": THINKING_PROMPT, "max_tokens": 300}],
    [{"prompt_ids": NGRAM_PROMPT, "max_tokens": 300}],
]
EXPECTED = [
    [SCRIPT.expected_output(thinking=True)[:REASONING_ONLY_TOKENS]],
    [SCRIPT.expected_output(thinking=False)],
    [SCRIPT.expected_output(thinking=True)],
    [SCRIPT.expected_output(thinking=True)],
]

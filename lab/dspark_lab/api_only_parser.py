"""A plugin-style reasoning parser that names no markers (tests of the parser-API path).

Load it as vLLM loads any plugin parser::

    --reasoning-parser dspark_test_api_only \\
    --reasoning-parser-plugin dspark_lab.api_only_parser

It exposes no ``reasoning_start_str``/``reasoning_end_str`` and no ``start_token_id``/
``end_token_id``, so the plugin can only follow it through ``is_reasoning_end`` (the prompt) and
``is_reasoning_end_streaming`` (each step's new tokens).  Reasoning ends at the token
``</think>``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from vllm.reasoning import ReasoningParser, ReasoningParserManager

NAME = "dspark_test_api_only"


class ApiOnlyReasoningParser(ReasoningParser):
    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        self._open = self.vocab["<think>"]
        self._close = self.vocab["</think>"]

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        for tok in reversed(input_ids):
            if tok in (self._open, self._close):
                return tok == self._close
        return False

    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Iterable[int]) -> bool:
        return self._close in delta_ids

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        return input_ids[input_ids.index(self._close) + 1 :] if self._close in input_ids else []

    def extract_reasoning(self, model_output: str, request: Any) -> tuple[str | None, str | None]:
        reasoning, _, content = model_output.partition("</think>")
        return reasoning, content or None

    def extract_reasoning_streaming(self, *args: Any) -> None:
        return None


ReasoningParserManager.register_module(NAME, module=ApiOnlyReasoningParser)

"""A reasoning-parser plugin whose ``is_reasoning_end_streaming`` raises (the fail-open tests).

Load it as any plugin parser::

    --reasoning-parser dspark_test_raising \\
    --reasoning-parser-plugin dspark_lab.raising_parser

It is ``api_only_parser``'s parser (no markers named: the plugin follows the phase through the
parser's API), except that from its ``N+1``-th ``is_reasoning_end_streaming`` call in a process
on, every call raises ``ValueError`` (``N`` = ``DSPARK_DYNAMIC_TEST_PARSER_RAISE_AFTER``, default
40): a third-party parser with a bug that shows only mid-generation.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from vllm.reasoning import ReasoningParserManager

from dspark_lab.api_only_parser import ApiOnlyReasoningParser

NAME = "dspark_test_raising"
RAISE_AFTER_ENV = "DSPARK_DYNAMIC_TEST_PARSER_RAISE_AFTER"
_calls = 0


class RaisingReasoningParser(ApiOnlyReasoningParser):
    def is_reasoning_end_streaming(self, input_ids: Sequence[int], delta_ids: Iterable[int]) -> bool:
        global _calls
        _calls += 1
        if _calls > int(os.environ.get(RAISE_AFTER_ENV, "40")):
            raise ValueError(f"parser bug (test): call {_calls} of is_reasoning_end_streaming")
        return super().is_reasoning_end_streaming(input_ids, delta_ids)


ReasoningParserManager.register_module(NAME, module=RaisingReasoningParser)

"""Stand-ins for vLLM objects, for tests and benchmarks of the pure-logic controller."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FakeRequest:
    """The four attributes of vLLM's ``Request`` that the controller reads or writes."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int] = field(default_factory=list)
    spec_token_ids: list[int] = field(default_factory=list)

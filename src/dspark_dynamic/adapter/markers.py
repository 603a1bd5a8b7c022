"""Resolve think-marker token ids.

Order, per side (start / end): explicit ids option -> explicit token-string option -> the
configured ``--reasoning-parser`` (vLLM's own parser class says which strings open and close
reasoning) -> the tokenizer's ``<think>`` / ``</think>``.  Parsers whose models end reasoning
implicitly when a tool call starts (DeepSeek-V4: ``｜DSML｜``) add that token to the end ids.
Every marker must be a single token id; otherwise resolution fails with a clear error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dspark_dynamic.core.options import DynamicDepthConfigError, DynamicDepthOptions
from dspark_dynamic.core.phase import PhaseRules

logger = logging.getLogger("vllm.dspark_dynamic")

DEFAULT_START = "<think>"
DEFAULT_END = "</think>"
# Reasoning parsers whose models may leave reasoning by starting a tool call without </think>.
IMPLICIT_END_TOKENS: dict[str, tuple[str, ...]] = {
    "deepseek_v4": ("｜DSML｜",),
    "deepseek_v41": ("｜DSML｜",),
}


@dataclass(frozen=True)
class ResolvedMarkers:
    start_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    source: str

    def rules(self) -> PhaseRules:
        return PhaseRules.of(self.start_ids, self.end_ids)


def single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` if the tokenizer has it as exactly one token, else None."""
    vocab = tokenizer.get_vocab()
    if text in vocab:
        return int(vocab[text])
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        return None
    # Guard against an unknown-token id standing in for text the vocabulary lacks.
    return int(ids[0]) if tokenizer.decode(ids) == text else None


def parser_marker_strings(parser_name: str, tokenizer: Any) -> tuple[str | None, str | None]:
    """Ask vLLM's registered reasoning parser which strings start and end reasoning."""
    from vllm.reasoning import ReasoningParserManager

    parser_cls = ReasoningParserManager.get_reasoning_parser(parser_name)
    # Thinking-mode kwargs: dispatching parsers (DeepSeek-V4) otherwise build an identity parser.
    kwargs = {"chat_template_kwargs": {"thinking": True, "enable_thinking": True}}
    try:
        parser = parser_cls(tokenizer, **kwargs)
    except TypeError:
        parser = parser_cls(tokenizer)
    start = getattr(parser, "reasoning_start_str", None) or getattr(parser, "start_token", None)
    end = getattr(parser, "reasoning_end_str", None) or getattr(parser, "end_token", None)
    return (start if isinstance(start, str) else None, end if isinstance(end, str) else None)


def _resolve_side(
    side: str,
    ids: tuple[int, ...],
    token: str | None,
    parsed: str | None,
    default: str,
    tokenizer: Any,
    parser: str | None,
    parser_note: str,
) -> tuple[tuple[int, ...], str]:
    """Ids and source for one side ("start" / "end"), in the documented order."""
    if ids:
        return ids, f"reasoning_{side}_ids option"
    if token is not None:
        tid = single_token_id(tokenizer, token)
        if tid is None:
            raise DynamicDepthConfigError(
                f"dspark_dynamic: invalid option 'think_{side}_token'={token!r}; allowed: a string "
                "that the tokenizer encodes as exactly one token"
            )
        return (tid,), f"think_{side}_token option"
    for text, source in ((parsed, f"reasoning parser {parser!r}"), (default, "tokenizer vocabulary")):
        tid = single_token_id(tokenizer, text) if text is not None else None
        if tid is not None:
            return (tid,), source
    parser_part = f"reasoning parser {parser!r} gave none{parser_note}" if parser else "no --reasoning-parser"
    raise DynamicDepthConfigError(
        f"dspark_dynamic: cannot resolve the think {side} marker: no 'think_{side}_token' or "
        f"'reasoning_{side}_ids' option, {parser_part}, and the tokenizer has no single token "
        f"{default!r}. Set 'think_start_token'/'think_end_token' (single tokens) or "
        "'reasoning_start_ids'/'reasoning_end_ids'."
    )


def resolve_markers(
    options: DynamicDepthOptions,
    reasoning_parser: str | None,
    get_tokenizer: Callable[[], Any],
) -> ResolvedMarkers:
    """Resolve the marker ids for ``options``; raises DynamicDepthConfigError if impossible."""
    if options.markers_resolved and options.think_start_token is None and options.think_end_token is None:
        return ResolvedMarkers(options.reasoning_start_ids, options.reasoning_end_ids, "options (ids)")
    tokenizer = get_tokenizer()
    if tokenizer is None:
        raise DynamicDepthConfigError(
            "dspark_dynamic: the think markers cannot be resolved without a tokenizer "
            "(skip_tokenizer_init is set); give 'reasoning_start_ids' and 'reasoning_end_ids'"
        )
    parsed: tuple[str | None, str | None] = (None, None)
    parser_note = ""
    if reasoning_parser:
        try:
            parsed = parser_marker_strings(reasoning_parser, tokenizer)
        except Exception as exc:  # an unusual parser: fall back to the vocabulary
            parser_note = f" (it failed: {exc})"
            logger.warning("dspark_dynamic: reasoning parser %r failed: %s", reasoning_parser, exc)
    start_ids, start_src = _resolve_side(
        "start", options.reasoning_start_ids, options.think_start_token, parsed[0], DEFAULT_START,
        tokenizer, reasoning_parser, parser_note,
    )
    end_ids, end_src = _resolve_side(
        "end", options.reasoning_end_ids, options.think_end_token, parsed[1], DEFAULT_END,
        tokenizer, reasoning_parser, parser_note,
    )
    if set(start_ids) & set(end_ids):
        raise DynamicDepthConfigError(
            f"dspark_dynamic: think start and end markers resolve to the same token ids "
            f"{sorted(set(start_ids) & set(end_ids))}; set distinct think_start_token/think_end_token"
        )
    implicit = []
    for text in IMPLICIT_END_TOKENS.get(reasoning_parser or "", ()):
        tid = single_token_id(tokenizer, text)
        if tid is not None and tid not in end_ids and tid not in start_ids:
            implicit.append(tid)
    source = f"start from {start_src}, end from {end_src}"
    if implicit:
        source += f", implicit end {implicit} from {reasoning_parser!r}"
    return ResolvedMarkers(start_ids, end_ids + tuple(implicit), source)

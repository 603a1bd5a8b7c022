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

from dspark_dynamic.options import DynamicDepthConfigError, DynamicDepthOptions
from dspark_dynamic.phase import PhaseRules

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
    parser_start = parser_end = None
    parser_error = ""
    if reasoning_parser:
        try:
            parser_start, parser_end = parser_marker_strings(reasoning_parser, tokenizer)
        except Exception as exc:  # an unusual parser: fall back to the vocabulary
            parser_error = f" (reasoning parser {reasoning_parser!r} failed: {exc})"
            logger.warning("dspark_dynamic: %s", parser_error.strip(" ()"))

    def side(ids: tuple[int, ...], key: str, token: str | None, parsed: str | None, default: str) -> tuple[tuple[int, ...], str]:
        if ids:
            return ids, f"{key} option"
        candidates = [(token, f"{key.replace('reasoning_', 'think_').replace('_ids', '_token')} option")]
        if token is None:
            candidates = [(parsed, f"reasoning parser {reasoning_parser!r}"), (default, "tokenizer vocabulary")]
        for text, source in candidates:
            if text is None:
                continue
            tid = single_token_id(tokenizer, text)
            if tid is not None:
                return (tid,), source
            if token is not None:
                raise DynamicDepthConfigError(
                    f"dspark_dynamic: invalid option {source.split()[0]!r}={text!r}; allowed: "
                    "a string that the tokenizer encodes as exactly one token"
                )
        raise DynamicDepthConfigError(
            f"dspark_dynamic: cannot resolve the think {key.split('_')[1]} marker: no "
            f"'{key}'/'think_{key.split('_')[1]}_token' option, "
            f"{'reasoning parser ' + repr(reasoning_parser) + ' gave none' if reasoning_parser else 'no --reasoning-parser'}"
            f"{parser_error}, and the tokenizer has no single token {default!r}. Set "
            "'think_start_token'/'think_end_token' (single tokens) or "
            "'reasoning_start_ids'/'reasoning_end_ids'."
        )

    start_ids, start_src = side(
        options.reasoning_start_ids, "reasoning_start_ids", options.think_start_token, parser_start, DEFAULT_START
    )
    end_ids, end_src = side(
        options.reasoning_end_ids, "reasoning_end_ids", options.think_end_token, parser_end, DEFAULT_END
    )
    implicit = []
    for text in IMPLICIT_END_TOKENS.get(reasoning_parser or "", ()):
        tid = single_token_id(tokenizer, text)
        if tid is not None and tid not in end_ids and tid not in start_ids:
            implicit.append(tid)
    if set(start_ids) & set(end_ids):
        raise DynamicDepthConfigError(
            f"dspark_dynamic: think start and end markers resolve to the same token ids "
            f"{sorted(set(start_ids) & set(end_ids))}; set distinct think_start_token/think_end_token"
        )
    source = f"start from {start_src}, end from {end_src}"
    if implicit:
        source += f", implicit end {implicit} from {reasoning_parser!r}"
    return ResolvedMarkers(start_ids, end_ids + tuple(implicit), source)

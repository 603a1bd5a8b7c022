"""Resolve what sets a request's phase: marker ids (single tokens or sequences), or a parser.

One order, per side (start / end): the explicit ids option -> the explicit token-string option
-> the configured ``--reasoning-parser`` (see ``reasoning_parsers``) -> the tokenizer's
``<think>`` / ``</think>``.  With none of them on either side (no marker option, no parser) and
no single ``<think>`` token, the model does not reason: every request stays in one phase, the
default (``ResolvedMarkers.one_phase``); a side that is given but does not resolve is an error.
Reset markers and the default phase come from the options, else from the parser.  A
configured parser that cannot be followed is an error, never a silent fallback.  Where the
parser names no markers but checks reasoning ends on each step's new tokens, its own API
follows the phase (``ResolvedMarkers.api``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dspark_dynamic.adapter.reasoning_parsers import ParserApiDetector, ParserPhase, encode_marker, parser_phase
from dspark_dynamic.core.options import MARKER_KEYS, DynamicDepthConfigError, DynamicDepthOptions
from dspark_dynamic.core.phase import Marker, OnePhase, Phase, PhaseDetector, PhaseRules, as_marker

logger = logging.getLogger("vllm.dspark_dynamic")

DEFAULT_START = "<think>"
DEFAULT_END = "</think>"

Option = int | tuple[int, ...]


def _option_form(marker: Marker) -> Option:
    return marker[0] if len(marker) == 1 else marker


def vocabulary_size(tokenizer: Any) -> int | None:
    """How many token ids ``tokenizer`` knows (added tokens included), or None if it cannot say."""
    try:
        return len(tokenizer)
    except TypeError:  # no __len__: the highest id of its vocabulary, plus one
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else None
        return max(vocab.values()) + 1 if vocab else None


def check_marker_ids(options: DynamicDepthOptions, size: int | None, vocabulary: str = "the tokenizer's") -> None:
    """Every id of the marker options lies in ``[0, size)``; else one error naming the key, the id
    and the vocabulary size (an id outside it never occurs, so its marker would never fire)."""
    if size is None:
        return
    for key in MARKER_KEYS:
        for marker in getattr(options, key):
            for token_id in as_marker(marker):
                if token_id >= size:
                    raise DynamicDepthConfigError(
                        f"dspark_dynamic: invalid option {key!r}: token id {token_id} is outside {vocabulary} "
                        f"vocabulary of {size} tokens (ids 0..{size - 1})"
                    )


@dataclass(frozen=True)
class ResolvedMarkers:
    start_ids: tuple[Option, ...]
    end_ids: tuple[Option, ...]
    source: str
    reset_ids: tuple[Option, ...] = ()
    default: Phase = Phase.ANSWER
    api: Callable[[], Any] | None = field(default=None, compare=False)
    parser_how: str = ""  # how the reasoning parser gave its part (reasoning_parsers.ParserPhase.how)

    @property
    def one_phase(self) -> bool:
        """No markers and no parser: every request stays in ``default`` (a model that does not reason)."""
        return self.api is None and not self.start_ids and not self.end_ids

    def rules(self) -> PhaseRules:
        return PhaseRules.of(self.start_ids, self.end_ids, self.reset_ids, self.default)

    def detector(self) -> PhaseDetector:
        if self.api is not None:
            return ParserApiDetector(self.api)
        return OnePhase(self.default) if self.one_phase else self.rules()


def _resolve_side(
    side: str,
    ids: tuple[Option, ...],
    token: str | None,
    parsed: tuple[Marker, ...] | None,
    tokenizer: Any,
    parser: str | None,
) -> tuple[tuple[Marker, ...], str]:
    """Markers and source for one side ("start" / "end"), in the documented order."""
    if ids:
        return tuple(as_marker(i) for i in ids), f"reasoning_{side}_ids option"
    if token is not None:
        marker = encode_marker(tokenizer, token)
        if marker is None:
            raise DynamicDepthConfigError(
                f"dspark_dynamic: invalid option 'think_{side}_token'={token!r}; allowed: a string "
                "that the tokenizer encodes to known tokens (one token or a sequence)"
            )
        return (marker,), f"think_{side}_token option"
    if parsed is not None:
        return parsed, f"reasoning parser {parser!r}"
    default = DEFAULT_START if side == "start" else DEFAULT_END
    marker = encode_marker(tokenizer, default)
    if marker is not None and len(marker) == 1:
        return (marker,), "tokenizer vocabulary"
    raise DynamicDepthConfigError(
        f"dspark_dynamic: cannot resolve the think {side} marker: no 'think_{side}_token' or "
        f"'reasoning_{side}_ids' option, no --reasoning-parser, and the tokenizer has no single "
        f"token {default!r}. Set 'think_start_token'/'think_end_token' or "
        "'reasoning_start_ids'/'reasoning_end_ids'."
    )


def resolve_markers(
    options: DynamicDepthOptions,
    reasoning_parser: str | None,
    get_tokenizer: Callable[[], Any],
    parser_plugin: str | None = None,
) -> ResolvedMarkers:
    """Resolve the phase markers for ``options``; raises DynamicDepthConfigError if impossible.

    ``parser_plugin``: vLLM's ``--reasoning-parser-plugin``, where ``reasoning_parser`` lives.
    Marker ids given as options are checked against the tokenizer's vocabulary first.
    """
    if any(getattr(options, key) for key in MARKER_KEYS):
        tokenizer = get_tokenizer()  # None (skip_tokenizer_init): the caller checks another way
        check_marker_ids(options, vocabulary_size(tokenizer) if tokenizer is not None else None)
    resolved = _resolve(options, reasoning_parser, get_tokenizer, parser_plugin)
    if resolved.api is None and not resolved.one_phase:
        try:  # contradictions surface here, before any engine starts
            resolved.rules()
        except ValueError as exc:
            raise DynamicDepthConfigError(
                f"dspark_dynamic: invalid markers ({resolved.source}): {exc}; check "
                "'reasoning_start_ids', 'reasoning_end_ids', 'reasoning_reset_ids' and 'default_phase'"
            ) from exc
    return resolved


def _resolve(
    options: DynamicDepthOptions,
    reasoning_parser: str | None,
    get_tokenizer: Callable[[], Any],
    parser_plugin: str | None,
) -> ResolvedMarkers:
    explicit_default = Phase[options.default_phase.upper()] if options.default_phase else None
    ids_only = options.think_start_token is None and options.think_end_token is None
    if options.markers_resolved and ids_only and (explicit_default is not None or not reasoning_parser):
        return ResolvedMarkers(
            options.reasoning_start_ids, options.reasoning_end_ids, "options (ids)",
            options.reasoning_reset_ids, explicit_default or Phase.ANSWER,
        )
    tokenizer = get_tokenizer()
    if tokenizer is None:
        raise DynamicDepthConfigError(
            "dspark_dynamic: the think markers cannot be resolved without a tokenizer "
            "(skip_tokenizer_init is set); give 'reasoning_start_ids' and 'reasoning_end_ids'"
        )
    start_given = bool(options.reasoning_start_ids) or options.think_start_token is not None
    end_given = bool(options.reasoning_end_ids) or options.think_end_token is not None
    parsed: ParserPhase | None = None
    if reasoning_parser and not (start_given and end_given and explicit_default is not None):
        parsed = parser_phase(reasoning_parser, tokenizer, parser_plugin)
    if parsed is not None and parsed.api is not None:
        if start_given or end_given:
            raise DynamicDepthConfigError(
                f"dspark_dynamic: reasoning parser {reasoning_parser!r} names no markers (its own "
                "API follows the phase); give both 'think_start_token' and 'think_end_token' (or "
                "both 'reasoning_*_ids') to use markers instead"
            )
        return ResolvedMarkers((), (), f"reasoning parser {reasoning_parser!r} (parser API)",
                               default=parsed.default, api=parsed.api, parser_how=parsed.how)
    if parsed is None and not (start_given or end_given or options.reasoning_reset_ids):
        default_start = encode_marker(tokenizer, DEFAULT_START)
        if default_start is None or len(default_start) != 1:  # a model that does not reason
            default = explicit_default or Phase.ANSWER
            return ResolvedMarkers((), (), (
                f"none: one phase ({default.label}) for every request; no marker option, no "
                f"--reasoning-parser, and the tokenizer has no single token {DEFAULT_START!r}"), default=default)
    start, start_src = _resolve_side(
        "start", options.reasoning_start_ids, options.think_start_token,
        parsed.start if parsed else None, tokenizer, reasoning_parser,
    )
    end, end_src = _resolve_side(
        "end", options.reasoning_end_ids, options.think_end_token,
        parsed.end if parsed else None, tokenizer, reasoning_parser,
    )
    both = set(start) & set(end)
    if both:
        raise DynamicDepthConfigError(
            f"dspark_dynamic: think start and end markers resolve to the same token ids "
            f"{sorted(list(m) for m in both)}; set distinct think_start_token/think_end_token"
        )
    reset = tuple(as_marker(i) for i in options.reasoning_reset_ids)
    if not reset and parsed is not None:
        reset = tuple(m for m in parsed.reset if m not in start and m not in end)
    default = explicit_default or (parsed.default if parsed is not None else Phase.ANSWER)
    source = f"start from {start_src}, end from {end_src}"
    if parsed is not None:
        source += f"; reasoning parser {reasoning_parser!r} via {parsed.how}"
    source += f"; default {default.label}"
    return ResolvedMarkers(
        tuple(_option_form(m) for m in start),
        tuple(_option_form(m) for m in end),
        source,
        tuple(_option_form(m) for m in reset),
        default,
        parser_how=parsed.how if parsed is not None else "",
    )

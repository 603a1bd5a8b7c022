"""Phase markers from vLLM's reasoning parsers (``--reasoning-parser NAME``).

For a parser name and the served tokenizer, :func:`parser_phase` returns what sets the phase:

1. **declared** markers (``DECLARED``) where the parser class does not say which tokens open and
   close reasoning (gpt-oss's harmony channels, Granite's phrases, ...), or says more than its
   markers (DeepSeek-V4's implicit ``｜DSML｜`` end, Cohere's turn token);
2. else the **engine grammar** of parsers built on vLLM's ``ParserEngine``: its start token,
   every token that ends reasoning (tool-call starts included) and its turn-boundary tokens;
3. else the parser's **marker strings** (``reasoning_start_str`` / ``reasoning_end_str``, or the
   ``start_token_id`` / ``end_token_id`` it looked up), one token or a token sequence each;
4. else the parser's **engine-side API** (``is_reasoning_end`` once on the prompt, then
   ``is_reasoning_end_streaming`` on each step's new tokens), as vLLM's structured-output
   manager uses it, when the parser implements the streaming check on the new tokens;
5. else a ``DynamicDepthConfigError`` saying why the parser cannot be followed.

The phase with no marker is the parser's own verdict on an empty sequence
(``is_reasoning_end([])`` False: reasoning), unless declared.  Parsers are built with thinking
switched on (``chat_template_kwargs`` ``thinking``/``enable_thinking``/``reasoning_effort``): per-request template
switches are seen through the markers the template writes into the prompt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dspark_dynamic.core.options import DynamicDepthConfigError
from dspark_dynamic.core.phase import Marker, Phase

logger = logging.getLogger("vllm.dspark_dynamic")

THINKING_KWARGS = {
    "chat_template_kwargs": {"thinking": True, "enable_thinking": True, "reasoning_effort": "high"}
}


@dataclass(frozen=True)
class Declared:
    """Marker strings for one parser, and why they are declared here rather than derived."""

    why: str
    start: tuple[str, ...] = ()
    end: tuple[str, ...] = ()
    reset: tuple[str, ...] = ()
    default: Phase | None = None
    replace: bool = True  # False: add to the derived markers
    requires: tuple[str, ...] = ()  # vocabulary tokens the format is built from


DECLARED: dict[str, Declared] = {
    "deepseek_v4": Declared(
        "a tool call may start with ｜DSML｜ without </think>; no marker: answer (both template "
        "modes write one)",
        end=("｜DSML｜",), default=Phase.ANSWER, replace=False,
    ),
    "deepseek_v41": Declared(
        "as deepseek_v4", end=("｜DSML｜",), default=Phase.ANSWER, replace=False,
    ),
    "openai_gptoss": Declared(
        "vLLM's parser reports reasoning as always ended (harmony parses channels); the phase is "
        "the harmony channel",
        start=("<|channel|>analysis<|message|>",),
        end=("<|channel|>final<|message|>", "<|channel|>commentary"),
        reset=("<|start|>",),
        default=Phase.REASONING,
        requires=("<|start|>", "<|channel|>", "<|message|>"),
    ),
    "granite": Declared(
        "the parser matches phrases in the text",
        start=("Here is my thought process:", "Here's my thought process:"),
        end=("Here is my response:", "Here's my response:"),
        default=Phase.ANSWER,
    ),
    "hunyuan_a13b": Declared(
        "the parser's end check reads its streaming state, not the tokens",
        start=("<think>\n",),
        end=("\n</think>\n<answer>\n", "</think>\n<answer>\n"),
        default=Phase.REASONING,
    ),
    "muse_glimmer": Declared(
        "the parser's end check means 'a tool channel opened' and decodes the whole text",
        start=("to=self<|message|>",),
        end=("<|eom|>", "to=user<|message|>"),
        default=Phase.REASONING,
    ),
    # vLLM 0.33/0.34's Muse parser in its Spark profile ("muse"; alias "musespark1x" in 0.33,
    # "musespark" in 0.34).  Its end check means the same as muse_glimmer's; its channels add
    # recipient-less messages (reasoning) and commentary (answer).  A tool channel's header
    # ("to=<tool><|message|>") also ends in <|message|>, so tool-call arguments count as
    # reasoning until <|eom|>: tool names cannot be listed as markers.
    "muse": Declared(
        "the parser's end check means 'a tool channel opened' and decodes the whole text; Spark "
        "routes to=self and recipient-less messages to reasoning, to=user and commentary to the answer",
        start=("to=self<|message|>", "<|message|>"),
        end=("<|eom|>", "to=user<|message|>", "to=commentary<|message|>"),
        default=Phase.REASONING,
    ),
    # vLLM 0.34: the markers are plain text (no token ids, so no engine-grammar ids), its
    # reasoning_end_str carries the template's newline, and the model opens <think> itself
    "ripple": Declared(
        "plain-text markers the engine grammar matches as text (any framing newlines); a tool call "
        "also ends reasoning; no marker: answer (the model decides per turn whether to think)",
        start=("<think>",),
        end=("</think>", "<tool_call>"),
        default=Phase.ANSWER,
    ),
    "inkling": Declared(
        "<|end_message|> closes every block kind; the next block's type decides (a model "
        "message opens with reasoning)",
        start=("<|content_thinking|>",),
        end=("<|content_text|>", "<|content_invoke_tool_json|>", "<|content_invoke_tool_text|>",
             "<|content_model_end_sampling|>"),
        reset=("<|message_model|>",),
        default=Phase.REASONING,
        requires=("<|content_thinking|>", "<|content_text|>"),
    ),
    "cohere_command3": Declared(
        "<|CHATBOT_TOKEN|> opens the turn, reasoning first", reset=("<|CHATBOT_TOKEN|>",), replace=False,
    ),
    "cohere_command4": Declared(
        "as cohere_command3", reset=("<|CHATBOT_TOKEN|>",), replace=False,
    ),
    "poolside_v1": Declared(
        "<assistant> opens the turn, reasoning first", reset=("<assistant>",), replace=False,
    ),
}
DECLARED["musespark1x"] = DECLARED["musespark"] = DECLARED["muse"]


@dataclass(frozen=True)
class ParserPhase:
    """What follows the phase for one parser: markers, or a per-request parser (``api``)."""

    start: tuple[Marker, ...] = ()
    end: tuple[Marker, ...] = ()
    reset: tuple[Marker, ...] = ()
    default: Phase = Phase.ANSWER
    how: str = ""
    api: Callable[[], Any] | None = field(default=None, compare=False)


def encode_marker(tokenizer: Any, text: str) -> Marker | None:
    """``text`` as token ids: its vocabulary id, else its encoding when that decodes back."""
    vocab = tokenizer.get_vocab()
    if text in vocab:
        return (int(vocab[text]),)
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    if not ids or tokenizer.decode(ids) != text:
        return None  # unknown-token ids stand in for text the vocabulary lacks
    return tuple(ids)


def marker_variants(tokenizer: Any, text: str) -> list[Marker]:
    """``text``'s encodings: alone and, for multi-token text, after a space or a newline
    (byte-level BPE merges the preceding whitespace into the first token)."""
    base = encode_marker(tokenizer, text)
    if base is None:
        return []
    out = [base]
    if len(base) > 1:
        for lead in (" ", "\n"):
            ids = tuple(int(i) for i in tokenizer.encode(lead + text, add_special_tokens=False))
            if ids and ids[-len(base):] != base and tokenizer.decode(list(ids)) == lead + text:
                out.append(ids)
    return out


def _markers(tokenizer: Any, texts: Sequence[str], name: str, role: str, required: bool = True) -> tuple[Marker, ...]:
    """Encodings of ``texts``; a text the tokenizer lacks is an error, or skipped if not ``required``."""
    out: list[Marker] = []
    for text in texts:
        found = marker_variants(tokenizer, text)
        if not found and not required:
            logger.debug("dspark_dynamic: %s marker %r of %r is not in the tokenizer", role, text, name)
        elif not found:
            raise DynamicDepthConfigError(
                f"dspark_dynamic: reasoning parser {name!r}: its {role} marker {text!r} is not in "
                "this tokenizer; set 'think_start_token'/'think_end_token' or 'reasoning_*_ids'"
            )
        out.extend(m for m in found if m not in out)
    return tuple(out)


def _vocab_ids(tokenizer: Any, texts: Sequence[str]) -> tuple[Marker, ...]:
    vocab = tokenizer.get_vocab()
    return tuple((int(vocab[t]),) for t in sorted(texts) if t in vocab)


def build_parser(name: str, tokenizer: Any, plugin: str | None = None) -> tuple[Any, Callable[[], Any]]:
    """An instance of vLLM's parser ``name`` (thinking on) and a factory for more.

    ``plugin``: the ``--reasoning-parser-plugin`` file, imported first when ``name`` is not
    registered yet (vLLM imports it only later, in the engine core, for offline ``LLM`` use).
    """
    from vllm.reasoning import ReasoningParserManager

    if plugin and len(plugin) > 3 and name not in ReasoningParserManager.list_registered():
        ReasoningParserManager.import_reasoning_parser(plugin)
    try:
        parser_cls = ReasoningParserManager.get_reasoning_parser(name)
    except KeyError as exc:
        raise DynamicDepthConfigError(f"dspark_dynamic: {exc.args[0] if exc.args else exc}") from exc

    def make() -> Any:
        try:
            return parser_cls(tokenizer, **{k: dict(v) for k, v in THINKING_KWARGS.items()})
        except TypeError:
            return parser_cls(tokenizer)

    try:
        return make(), make
    except Exception as exc:
        raise DynamicDepthConfigError(
            f"dspark_dynamic: reasoning parser {name!r} cannot be used to follow the phase: building "
            f"it with this tokenizer failed ({type(exc).__name__}: {exc}). Give the markers as "
            "options instead ('think_start_token'/'think_end_token' or 'reasoning_*_ids', and "
            "'default_phase')"
        ) from exc


def _engine_markers(parser: Any, tokenizer: Any) -> ParserPhase | None:
    engine = getattr(parser, "_parser_engine", None)
    config = getattr(engine, "parser_engine_config", None)
    end_ids = getattr(engine, "reasoning_end_token_ids", None)
    if config is None or not end_ids:
        return None
    vocab = tokenizer.get_vocab()
    start_text = config.token_id_terminals.get("THINK_START")
    start = ((int(vocab[start_text]),),) if start_text in vocab else ()
    return ParserPhase(
        start=start,
        end=tuple((int(i),) for i in sorted(end_ids)),
        reset=_vocab_ids(tokenizer, config.turn_boundary_tokens),
        how="engine grammar",
    )


def _string_markers(parser: Any, tokenizer: Any, name: str) -> ParserPhase | None:
    start = getattr(parser, "reasoning_start_str", None)
    end = getattr(parser, "reasoning_end_str", None)
    if isinstance(start, str) and start and isinstance(end, str) and end:
        return ParserPhase(
            start=_markers(tokenizer, [start], name, "start"),
            end=_markers(tokenizer, [end], name, "end"),
            how="marker strings",
        )
    start_id = getattr(parser, "start_token_id", None)
    end_id = getattr(parser, "end_token_id", None)
    if isinstance(start_id, int) and isinstance(end_id, int):
        return ParserPhase(start=((start_id,),), end=((end_id,),), how="marker token ids")
    return None


def _streams_on_new_tokens(parser: Any) -> bool:
    from vllm.reasoning import ReasoningParser

    return type(parser).is_reasoning_end_streaming is not ReasoningParser.is_reasoning_end_streaming


def _parser_default(parser: Any) -> Phase:
    try:
        return Phase.ANSWER if parser.is_reasoning_end([]) else Phase.REASONING
    except Exception:  # a parser that cannot judge an empty sequence
        return Phase.REASONING


def parser_phase(name: str, tokenizer: Any, plugin: str | None = None) -> ParserPhase:
    """How the phase is followed for ``--reasoning-parser name`` with ``tokenizer``."""
    parser, make = build_parser(name, tokenizer, plugin)
    declared = DECLARED.get(name)
    derived: ParserPhase | None = None
    if declared is None or not declared.replace:
        derived = _engine_markers(parser, tokenizer) or _string_markers(parser, tokenizer, name)
    if declared is None and derived is None:
        if _streams_on_new_tokens(parser):
            return ParserPhase(default=_parser_default(parser), how="parser API", api=make)
        raise DynamicDepthConfigError(
            f"dspark_dynamic: reasoning parser {name!r} cannot be used to follow the phase: it "
            "names no marker tokens, and its is_reasoning_end_streaming rescans the whole sequence "
            "every step. Set 'think_start_token'/'think_end_token' or 'reasoning_*_ids'"
        )
    start, end, reset = (derived.start, derived.end, derived.reset) if derived else ((), (), ())
    how = derived.how if derived else "declared"
    default = _parser_default(parser)
    if declared is not None:
        missing = [t for t in declared.requires if t not in tokenizer.get_vocab()]
        if missing:
            raise DynamicDepthConfigError(
                f"dspark_dynamic: reasoning parser {name!r} cannot be used to follow the phase: this "
                f"tokenizer has no token {missing[0]!r}, which its format is built from"
            )
        # declared markers the tokenizer lacks are skipped: the check below refuses a parser left
        # without an end (or a way into reasoning)
        start += tuple(m for m in _markers(tokenizer, declared.start, name, "start", False) if m not in start)
        end += tuple(m for m in _markers(tokenizer, declared.end, name, "end", False) if m not in end + start)
        reset += tuple(m for m in _markers(tokenizer, declared.reset, name, "reset", False) if m not in reset)
        if declared.default is not None:
            default = declared.default
        if derived is not None:
            how += " + declared"
    if not end or not (start or default is Phase.REASONING):
        raise DynamicDepthConfigError(
            f"dspark_dynamic: reasoning parser {name!r} cannot be used to follow the phase: with "
            f"this tokenizer it gives no {'end' if not end else 'start'} marker"
        )
    return ParserPhase(start, end, reset, default, how)


class ParserApiDetector:
    """Phase from a parser's own engine-side API: one parser per request, as vLLM's
    structured-output manager builds them.  Reasoning ends once (a latch)."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    def track(self, request: Any) -> "ParserApiTracker":
        return ParserApiTracker(self.make(), request)


class ParserApiTracker:
    __slots__ = ("parser", "request", "phase", "consumed")

    def __init__(self, parser: Any, request: Any) -> None:
        self.parser = parser
        self.request = request
        ended = parser.is_reasoning_end(list(request.prompt_token_ids or ()))
        self.phase = Phase.ANSWER if ended else Phase.REASONING
        self.consumed = 0

    def advance(self, rules: Any, output_token_ids: Sequence[int]) -> Phase:
        n = len(output_token_ids)
        if n > self.consumed and self.phase is Phase.REASONING:
            new = list(output_token_ids[self.consumed : n])
            if self.parser.is_reasoning_end_streaming(self.request.all_token_ids, new):
                self.phase = Phase.ANSWER
        self.consumed = n
        return self.phase

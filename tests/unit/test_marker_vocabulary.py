"""Marker ids are checked against the vocabulary, and an empty marker list is refused, before any
engine starts (the argument-parsing process resolves the options; these call the same code)."""

from types import SimpleNamespace

import pytest

from dspark_dynamic.adapter.build import resolve_options
from dspark_dynamic.adapter.markers import resolve_markers, vocabulary_size
from dspark_dynamic.core.options import MARKER_KEYS, DynamicDepthConfigError, parse_options


class SizedTokenizer:
    """A tokenizer of ``size`` ids with <think> = 10 and </think> = 11 (``len()`` as HF's)."""

    def __init__(self, size):
        self.size = size
        self.calls = 0

    def __len__(self):
        return self.size

    def get_vocab(self):
        return {"<think>": 10, "</think>": 11, **{f"t{i}": i for i in range(12, self.size)}}

    def encode(self, text, add_special_tokens=False):
        return [self.get_vocab().get(w, 0) for w in text.split()]

    def decode(self, ids):
        inverse = {v: k for k, v in self.get_vocab().items()}
        return " ".join(inverse.get(i, "<unk>") for i in ids)


class UnsizedTokenizer(SizedTokenizer):
    """No ``__len__``: the size is the highest id of its vocabulary plus one."""

    __len__ = None


def resolve(raw, tokenizer):
    return resolve_markers(parse_options(raw, 2), None, lambda: tokenizer)


@pytest.mark.parametrize("key, raw, bad", [
    ("reasoning_end_ids", {"reasoning_start_ids": [4], "reasoning_end_ids": [99999]}, 99999),
    ("reasoning_start_ids", {"reasoning_start_ids": [512], "reasoning_end_ids": [11]}, 512),  # one past the end
    ("reasoning_start_ids", {"reasoning_start_ids": [[10, 700]], "reasoning_end_ids": [11]}, 700),  # in a sequence
    ("reasoning_reset_ids", {"reasoning_reset_ids": [3, 600]}, 600),  # reset markers too
])
def test_an_id_outside_the_vocabulary_is_refused_naming_the_key_the_id_and_the_size(key, raw, bad):
    with pytest.raises(DynamicDepthConfigError) as err:
        resolve(raw, SizedTokenizer(512))
    message = str(err.value)
    assert "\n" not in message
    assert f"'{key}'" in message and f"token id {bad} " in message and "vocabulary of 512 tokens" in message


def test_the_last_id_of_the_vocabulary_is_accepted():
    m = resolve({"reasoning_start_ids": [510], "reasoning_end_ids": [[12, 511]]}, SizedTokenizer(512))
    assert (m.start_ids, m.end_ids) == ((510,), ((12, 511),))


def test_the_size_of_a_tokenizer_without_len_is_its_highest_id_plus_one():
    tok = UnsizedTokenizer(300)
    assert vocabulary_size(tok) == 300
    with pytest.raises(DynamicDepthConfigError, match="'reasoning_end_ids': token id 300 .* of 300 tokens"):
        resolve({"reasoning_start_ids": [10], "reasoning_end_ids": [300]}, tok)


def test_ids_pass_unchecked_without_a_tokenizer_in_resolve_markers():
    # skip_tokenizer_init: resolve_markers has no vocabulary; resolve_options checks the model's (below)
    m = resolve_markers(parse_options({"reasoning_start_ids": [1], "reasoning_end_ids": [99999]}, 2), None, lambda: None)
    assert m.end_ids == (99999,)


def test_without_a_tokenizer_the_models_vocabulary_bounds_the_ids():
    spec = SimpleNamespace(num_speculative_tokens=2)
    model = SimpleNamespace(skip_tokenizer_init=True, get_vocab_size=lambda: 256)
    raw = {"reasoning_start_ids": [4], "reasoning_end_ids": [256]}
    with pytest.raises(DynamicDepthConfigError, match="'reasoning_end_ids': token id 256 is outside the model's "
                                                      "vocabulary of 256 tokens"):
        resolve_options(raw, spec, None, model)
    options, markers = resolve_options({**raw, "reasoning_end_ids": [255]}, spec, None, model)
    assert markers.end_ids == (255,) and options.reasoning_end_ids == (255,)


@pytest.mark.parametrize("key", MARKER_KEYS)
def test_an_empty_marker_list_is_refused_naming_the_key(key):
    with pytest.raises(DynamicDepthConfigError) as err:
        parse_options({key: []}, 2)
    assert f"'{key}'=[]" in str(err.value) and "at least one marker" in str(err.value)


def test_markers_not_given_round_trip_as_null():
    # the resolved options are written back into additional_config and parsed again in the engine
    opts = parse_options({"reasoning_start_ids": [4], "reasoning_end_ids": [5]}, 2)
    out = opts.to_dict()
    assert out["reasoning_reset_ids"] is None
    assert parse_options(out, 2) == opts

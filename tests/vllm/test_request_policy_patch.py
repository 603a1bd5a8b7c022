"""A bad per-request policy is refused where vLLM checks ``SamplingParams``: the wrapper of the
installed vLLM's ``InputProcessor._validate_params``, with vLLM's own params and error class."""

from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

from vllm import SamplingParams  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402

from dspark_dynamic.adapter.patches.request_policy import PATCHES, _validate_params  # noqa: E402


class Processor:
    def __init__(self, raw=None, n=2):
        self.vllm_config = SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens=n),
            additional_config={} if raw is None else {"dspark_dynamic": raw})


def validate(processor, extra_args):
    seen = []
    wrapped = _validate_params(lambda self, params, tasks: seen.append(params) or "vllm's result")
    result = wrapped(processor, SamplingParams(max_tokens=4, extra_args=extra_args), ("generate",))
    assert seen and result == "vllm's result"  # vLLM's own checks ran first, its result passed on
    return result


def test_the_patch_target_exists_in_the_installed_vllm():
    (patch,) = PATCHES
    assert patch.problem() is None


def test_good_arguments_and_other_extra_args_pass():
    processor = Processor({"policy": "adaptive"})
    validate(processor, {"dspark_dynamic_depth": 0})
    validate(processor, {"dspark_dynamic_policy": "adaptive"})
    validate(processor, {"kv_transfer_params": {"x": 1}})
    validate(processor, None)


@pytest.mark.parametrize("extra, key", [
    ({"dspark_dynamic_depth": 3}, "dspark_dynamic_depth"),
    ({"dspark_dynamic_policy": "vllm-av"}, "dspark_dynamic_policy"),
    ({"dspark_dynamic_detph": 1}, "dspark_dynamic_detph"),
])
def test_a_bad_argument_is_vllms_validation_error_naming_the_key(extra, key):
    with pytest.raises(VLLMValidationError) as err:
        validate(Processor({"policy": "adaptive"}), extra)
    assert err.value.parameter == key and key in str(err.value)


def test_without_the_plugin_configured_nothing_is_checked():
    validate(Processor(None), {"dspark_dynamic_depth": 99})
    validate(Processor({"policy": "adaptive"}, n=0), {"dspark_dynamic_depth": 99})  # no speculative decoding

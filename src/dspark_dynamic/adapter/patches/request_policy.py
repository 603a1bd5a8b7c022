"""A depth policy per request: refused at admission when bad, read by the engine core's controller.

``InputProcessor._validate_params`` (the API server or ``LLM`` process, where vLLM checks every
request's ``SamplingParams`` before it reaches the engine) additionally parses the request's
``dspark_dynamic_*`` extra arguments (``core/request_policy.py``) when the plugin is configured.
A bad value raises vLLM's ``VLLMValidationError`` (with ``parameter`` = the key; a plain
``ValueError`` on a vLLM without that class): the OpenAI server answers that request alone with
HTTP 400, ``LLM.generate`` raises before the engine sees it.  Without ``dspark_dynamic`` options, or without such keys, nothing changes.

``request_policy_reader`` is the engine core's side: the controller asks it once per request.
A value that reached the engine core unchecked (a client of the engine core itself) and is bad
leaves that request on the server's policy, with one warning; it never faults the engine.

Removable when vLLM takes a per-request speculation depth in ``SamplingParams``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dspark_dynamic.adapter.patching import Patch, Where
from dspark_dynamic.core.options import DynamicDepthOptions
from dspark_dynamic.core.request_policy import RequestPolicy, RequestPolicyError, parse_request_policy

logger = logging.getLogger("vllm.dspark_dynamic")

MODULE = "vllm.v1.engine.input_processor"
ATTR = "_dspark_dynamic_request_policy"


def parse_for(options: DynamicDepthOptions, extra_args: Any) -> RequestPolicy | None:
    """``parse_request_policy`` against the server's options."""
    return parse_request_policy(extra_args, options.num_speculative_tokens, options.policy,
                                options.reasoning_depth, options.answer_depth)


def request_policy_reader(options: DynamicDepthOptions) -> Callable[[Any], RequestPolicy | None]:
    """Engine core: a request's own policy, from its ``sampling_params.extra_args``."""

    def read(request: Any) -> RequestPolicy | None:
        extra = getattr(getattr(request, "sampling_params", None), "extra_args", None)
        if not extra:
            return None
        try:
            return parse_for(options, extra)
        except RequestPolicyError as exc:
            logger.warning("dspark_dynamic: request %s keeps the server's policy: %s", request.request_id, exc)
            return None

    return read


def _validation_error(exc: RequestPolicyError) -> ValueError:
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:  # an older vLLM: a plain ValueError is a 400 as well
        return ValueError(str(exc))
    return VLLMValidationError(str(exc), parameter=exc.key, value=exc.value)


def _options_of(processor: Any) -> DynamicDepthOptions | None:
    options = processor.__dict__.get(ATTR, False)
    if options is False:
        from dspark_dynamic.adapter.build import worker_options

        options = worker_options(getattr(processor, "vllm_config", None))
        processor.__dict__[ATTR] = options
    return options


def _validate_params(original):
    def validate_params(self, params, *args, **kwargs):
        result = original(self, params, *args, **kwargs)
        extra = getattr(params, "extra_args", None)
        if extra:
            try:
                options = _options_of(self)
                if options is not None:
                    parse_for(options, extra)
            except RequestPolicyError as exc:
                raise _validation_error(exc) from None
            except Exception as exc:  # the plugin's own fault: vLLM's checks stand, the engine reads it again
                logger.warning("dspark_dynamic: checking a request's dspark_dynamic_* arguments failed (%r)", exc)
        return result

    return validate_params


I = "v1/engine/input_processor.py"

PATCHES = (
    Patch(
        "request-policy-validate",
        MODULE,
        "InputProcessor._validate_params",
        _validate_params,
        params=("params",),
        why="refuse a bad per-request dspark_dynamic_* argument before the engine sees the request (HTTP 400)",
        process="API server / LLM",
        where=Where(f"{I}:82", f"{I}:138", f"{I}:138", v034=f"{I}:130"),
        removable_when="vLLM takes a per-request speculation depth in SamplingParams",
    ),
)

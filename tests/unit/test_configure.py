from types import SimpleNamespace

import pytest

from dspark_dynamic.configure import reasoning_parser_of, resolve_batch_depth
from dspark_dynamic.options import parse_options
from dspark_dynamic.policy import BatchDepth


class Mode:
    def __init__(self, full):
        self.full = full

    def has_full_cudagraphs(self):
        return self.full


def config(method="dspark", full=True, eager=False, av=False):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(method=method, enable_adaptive_verification=av),
        compilation_config=SimpleNamespace(cudagraph_mode=Mode(full)),
        model_config=SimpleNamespace(enforce_eager=eager),
    )


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (config(), BatchDepth.MAX),  # the fork: DSpark + FULL graphs on uniform-only backends
        (config(full=False), BatchDepth.PER_REQUEST),
        (config(eager=True), BatchDepth.PER_REQUEST),
        (config(method="draft_model"), BatchDepth.PER_REQUEST),  # Model Runner V1
        (config(av=True), BatchDepth.PER_REQUEST),  # 0.33 adaptive verification: varlen graphs
    ],
)
def test_auto_batch_depth(cfg, expected):
    assert resolve_batch_depth(parse_options({}, 2), cfg) is expected


def test_explicit_batch_depth_wins():
    assert resolve_batch_depth(parse_options({"batch_depth": "min"}, 2), config()) is BatchDepth.MIN


def test_reasoning_parser_lookup():
    cfg = SimpleNamespace(reasoning_config=None, structured_outputs_config=SimpleNamespace(reasoning_parser="deepseek_v4"))
    assert reasoning_parser_of(cfg) == "deepseek_v4"
    assert reasoning_parser_of(SimpleNamespace()) is None

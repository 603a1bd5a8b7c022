import pytest

from dspark_dynamic.core.phase import Phase
from dspark_dynamic.core.policy import BatchDepth, PhasePolicy, apply_batch_depth


def test_phase_policy_depths():
    policy = PhasePolicy(reasoning_depth=1, answer_depth=2)
    assert policy.depth(Phase.REASONING) == 1
    assert policy.depth(Phase.ANSWER) == 2
    with pytest.raises(ValueError):
        PhasePolicy(-1, 2)


@pytest.mark.parametrize(
    "mode, depths, expected",
    [
        (BatchDepth.PER_REQUEST, [1, 2, 1], [1, 2, 1]),
        (BatchDepth.MAX, [1, 2, 1], [2, 2, 2]),
        (BatchDepth.MIN, [1, 2, 1], [1, 1, 1]),
        (BatchDepth.MAX, [0, 0], [0, 0]),
        (BatchDepth.MIN, [], []),
    ],
)
def test_batch_depth_on_mixed_phase_batches(mode, depths, expected):
    assert apply_batch_depth(depths, mode) == expected

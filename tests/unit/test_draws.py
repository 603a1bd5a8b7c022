import random
import statistics

import pytest

from dspark_dynamic.core.draws import normals


@pytest.mark.parametrize("n", [1, 2, 7, 8])
def test_normals_returns_as_many_draws_as_asked(n):
    assert len(normals(random.Random(0), n)) == n


def test_normals_are_standard_normal_and_independent():
    rng = random.Random(1)
    draws = [normals(rng, 8) for _ in range(5000)]
    flat = [z for row in draws for z in row]
    assert statistics.fmean(flat) == pytest.approx(0.0, abs=0.03)
    assert statistics.pstdev(flat) == pytest.approx(1.0, abs=0.03)
    assert sum(abs(z) > 1.96 for z in flat) / len(flat) == pytest.approx(0.05, abs=0.01)
    # the two draws of one pair (cos and sin of one angle) are uncorrelated
    pairs = [(row[0], row[1]) for row in draws]
    assert abs(statistics.correlation([a for a, _ in pairs], [b for _, b in pairs])) < 0.05


def test_normals_depend_only_on_the_generators_state():
    assert normals(random.Random(5), 6) == normals(random.Random(5), 6)
    assert normals(random.Random(5), 6) != normals(random.Random(6), 6)

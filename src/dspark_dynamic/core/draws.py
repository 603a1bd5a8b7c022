"""Standard normal draws for the controller's Thompson sampling (pure logic).

``normals(rng, n)`` returns ``n`` independent standard normal draws: the Box-Muller transform of
pairs of ``rng.random()`` (each pair gives two), about half the host time of ``n`` calls to
``rng.gauss``.  Invariant: the draws depend only on ``rng``'s state, which advances by two
uniforms per pair.
"""

from __future__ import annotations

import math
import random

_TWO_PI = 2.0 * math.pi
_sqrt, _log, _cos, _sin = math.sqrt, math.log, math.cos, math.sin


def normals(rng: random.Random, n: int) -> list[float]:
    uniform = rng.random
    out: list[float] = []
    for _ in range((n + 1) >> 1):
        radius = _sqrt(-2.0 * _log(1.0 - uniform()))  # 1 - u lies in (0, 1]: log is finite
        angle = _TWO_PI * uniform()
        out += (radius * _cos(angle), radius * _sin(angle))
    if n & 1:
        out.pop()
    return out

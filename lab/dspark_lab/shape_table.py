"""A mean step time per step shape, as the peers tabulate their costs (pure logic; the
alternative ``scripts/cost_models.py`` measures ``core.costs.StepCost`` against).

Invariants: one cell per shape seen, each a forgetting mean with residuals clipped as
``StepCost`` clips them; nothing is shared between shapes.
"""

from __future__ import annotations

from dspark_dynamic.core.costs import CLIP, MEMORY, Shape


class ShapeTable:
    """A mean step time per shape with forgetting and the same clipping (what the peers tabulate);
    an unseen shape is predicted by the nearest seen one with the same requests, else by
    ``fallback``."""

    def __init__(self, memory: float = MEMORY) -> None:
        self.keep = 1.0 - 1.0 / memory
        self.cells: dict[Shape, list[float]] = {}  # shape -> [weight, mean, mean absolute residual]

    def learn_one(self, shape: Shape, seconds: float) -> None:
        cell = self.cells.get(shape)
        if cell is None:
            self.cells[shape] = [1.0, seconds, 0.0]
            return
        err = seconds - cell[1]
        if cell[2] > 0.0:
            bound = CLIP * cell[2]
            err = -bound if err < -bound else (bound if err > bound else err)
        cell[2] = abs(err) if cell[2] == 0.0 else 0.98 * cell[2] + 0.02 * abs(err)
        cell[0] = cell[0] * self.keep + 1.0
        cell[1] += err / cell[0]

    def predict_one(self, shape: Shape, fallback: float | None = None) -> float | None:
        cell = self.cells.get(shape)
        if cell is not None:
            return cell[1]
        near = [(abs(s.verified - shape.verified) + abs(s.drafted - shape.drafted), c[1])
                for s, c in self.cells.items() if s.requests == shape.requests]
        return min(near)[1] if near else fallback

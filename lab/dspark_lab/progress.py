"""Progress of long benchmark and soak runs: a tqdm bar (vLLM installs tqdm) on stderr.

``track`` wraps the loop over a run's rounds: the bar counts rounds (or requests), shows the
rate and the ETA, and after each round a short status the caller computes (the running paired
ratios of a wall-clock run, the wrong outputs and tracked requests of a soak).  The bar writes
to stderr only, so a run's printed report and its ``--json`` are the same with or without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def track(items: Iterable[T], desc: str, unit: str, total: int | None = None,
          size: Callable[[T], int] = lambda item: 1, status: Callable[[], str] = lambda: "",
          enabled: bool = True) -> Iterator[T]:
    """Yield ``items``; once the caller's work on an item is done, advance the bar by
    ``size(item)`` and show ``status()``.  ``total``: the sum of the sizes (default: the
    number of items, where ``items`` has a length)."""
    from tqdm import tqdm

    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True) as bar:
        for item in items:
            yield item
            bar.update(size(item))
            text = status()
            if text:
                bar.set_postfix_str(text, refresh=True)


def ratios_so_far(result: Any, shown: int = 2) -> str:
    """The first ``shown`` paired ratios of a wall-clock result over the rounds measured so far
    (medians; ``result.summary()["ratios"]``), or "warm-up" before the first measured round."""
    if not getattr(result, "rounds", None):
        return "warm-up"
    ratios = list(result.summary()["ratios"].items())[:shown]
    return ", ".join(f"{name} {value['median']:.3f}" for name, value in ratios)

"""One decision per step for the whole batch: what to verify, and how deep to draft (pure logic).

Both maximise the step's expected tokens per expected second, ``T / C``, at costs from the step
cost model (``costs.py``, one posterior draw per draw period) and acceptance from ``acceptance.py`` or
the drafter's calibrated confidences (``confidence.py``).

- ``admit`` (this step, drafts in hand): every request's draft slots, ranked by survival per
  unit of their own verify time ``s / v_r`` (``s`` the expected tokens the slot adds, ``v_r``
  what verifying one draft of request r costs: its context makes it dearer), are admitted while
  a slot's ``s`` beats what its verify time is worth at the step's current rate
  (``s > v_r * T / C``); the step verifies nothing if the admitted set does not pay for the
  step's first-verified term as well.  ``uniform``: one depth for every request (FULL CUDA
  graphs), the one with the best ``T / C``.
- ``drafting_depth`` (the next step, before its drafts exist): the drafter's depth ``D`` for the
  batch, the one whose expected gated gains, ``E[(s - rate * v_r)^+]`` summed over requests and
  positions ``< D``, beat most what drafting ``D`` positions (and the first-verified term, as
  often as the gate will pay it) costs at ``rate``, the batch's rate without drafts.

Invariants: a request's admitted drafts are a prefix of its drafts; the rules are the same at
any batch size; with every ``v_r <= 0`` and no first-verified term every draft is admitted;
with one ``v`` for all requests the ranking is by survival alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dspark_dynamic.core.acceptance import gated

# (rate: tokens per second) -> (summed gated gains per position, expected verified drafts per
#                               position, share of steps that verify any draft)
GainsAt = Callable[[float], tuple[list[float], list[float], float]]


def admit(survivals: Sequence[Sequence[float]], base: float, verify: float | Sequence[float], first: float = 0.0,
          uniform: str | None = None) -> list[int]:
    """Drafts to verify per request: ``survivals[r][j]`` is request r's (j+1)-th draft's expected
    tokens; ``base`` the step's time without verifying any draft; ``verify`` per verified draft
    (one for all, or one per request); ``first`` once if any is verified (seconds, or any unit
    shared by all three)."""
    n = len(survivals)
    if not n:
        return []
    if not isinstance(verify, (int, float)):
        if n == 1 or min(verify) == max(verify):
            verify = verify[0]
        else:
            return _admit_priced(survivals, base, list(verify), first, uniform)
    if uniform is not None and n > 1:
        deepest = max(len(s) for s in survivals)
        best_k, best = 0, -1.0
        for k in range(deepest + 1):
            tokens = n + sum(sum(s[:k]) for s in survivals)
            verified = sum(min(k, len(s)) for s in survivals)
            ratio = tokens / (base + verify * verified + (first if verified else 0.0))
            if ratio > best or (uniform == "max" and ratio >= best):
                best_k, best = k, ratio
        return [min(best_k, len(s)) for s in survivals]
    deeper_on_ties = uniform == "max"
    tokens, cost = float(n), base + first
    if n == 1:  # survivals fall along one request's drafts: no sort needed
        k = 0
        for s in survivals[0]:
            if s * cost < verify * tokens or (s * cost == verify * tokens and not deeper_on_ties):
                break
            k += 1
            tokens += s
            cost += verify
        depths = [k]
    else:
        depths = [0] * n
        for s, r in sorted(((s, r) for r, row in enumerate(survivals) for s in row), reverse=True):
            if s * cost <= verify * tokens:
                break
            depths[r] += 1  # survivals fall along a request's drafts: its prefix comes first
            tokens += s
            cost += verify
    if first and any(depths) and (tokens * base < n * cost or (tokens * base == n * cost and not deeper_on_ties)):
        return [0] * n  # the admitted drafts do not pay for the first-verified term
    return depths


def _admit_priced(survivals: Sequence[Sequence[float]], base: float, verify: list[float], first: float,
                  uniform: str | None) -> list[int]:
    """``admit`` where requests' drafts cost differently to verify (``verify[r]``)."""
    n = len(survivals)
    if uniform is not None:
        best_k, best = 0, -1.0
        for k in range(max(len(s) for s in survivals) + 1):
            tokens = n + sum(sum(s[:k]) for s in survivals)
            cost = base + sum(v * min(k, len(s)) for s, v in zip(survivals, verify))
            ratio = tokens / (cost + (first if k and any(survivals) else 0.0))
            if ratio > best or (uniform == "max" and ratio >= best):
                best_k, best = k, ratio
        return [min(best_k, len(s)) for s in survivals]
    depths = [0] * n
    tokens, cost = float(n), base + first
    verify = [max(v, 0.0) for v in verify]
    slots = sorted(((s / verify[r] if verify[r] > 0.0 else float("inf"), s, r)
                    for r, row in enumerate(survivals) for s in row),
                   reverse=True)  # survivals fall along a request's drafts: its prefix comes first
    for _ratio, s, r in slots:
        v = verify[r]
        if s * cost <= v * tokens:
            break  # nothing was admitted since, so the slots below (worth less per second) do not pay either
        depths[r] += 1
        tokens += s
        cost += v
    if first and any(depths) and tokens * base <= n * cost:
        return [0] * n  # the admitted drafts do not pay for the first-verified term
    return depths


def drafting_depth(requests: int, base: float, first: float, drafting: Sequence[float], gains_at: GainsAt,
                   lo: int = 0) -> int:
    """The drafter's depth for the next step, in ``[lo, len(drafting) - 1]``.

    ``drafting[D]``: what drafting ``D`` positions costs the step (``drafting[0]`` is 0 unless
    the drafter runs anyway); ``gains_at(rate)``: the batch's gated gains per position, each
    request's verified draft priced at ``rate`` times its verify time (see ``GainsAt``).
    """
    rate = requests / base  # the batch's rate without drafts: what a verified draft is priced at
    gains, _counts, any_share = gains_at(rate)
    best, best_net = lo, None
    total, base_drafting = 0.0, drafting[0]
    for d, cost in enumerate(drafting):
        if d:
            total += gains[d - 1] if d - 1 < len(gains) else 0.0
        if d < lo:
            continue
        net = total - rate * (cost - base_drafting + (first * any_share if d else 0.0))
        if best_net is None or net >= best_net:  # ties to the deeper: the gate may still use it
            best, best_net = d, net
    return best


def gated_gains(rows: Sequence[Sequence[Any]], positions: int, rate: float) -> tuple[list[float], list[float], float]:
    """``GainsAt`` of a batch at ``rate``: each row is (requests it stands for, drawn survivals,
    the draw's moves of them or None, a ``GateSample`` or None, per position the request's own
    gated survivals or None, its verify time per draft); a position is priced at ``rate`` times
    the row's verify time, by the phase's gated drafts (moved by the draw), else the request's
    own, else its drawn survival as if sure or hopeless."""
    gains, counts = [0.0] * positions, [0.0] * positions
    none_first = 1.0
    for times, drawn, moved, sample, recent, verify in rows:
        price = rate * verify
        for j in range(positions):
            if sample is not None and sample.count(j) >= 2:
                g, c = sample.gated(j, price - moved[j])
            elif recent is not None and len(recent[j]) >= 2:
                g, c = gated(recent[j], price)
            else:
                v = drawn[j]
                g, c = (v - price, 1.0) if v > price else (0.0, 0.0)
            gains[j] += times * g
            counts[j] += times * c
            if j == 0:
                none_first *= (1.0 - c) ** times
    return gains, counts, 1.0 - none_first

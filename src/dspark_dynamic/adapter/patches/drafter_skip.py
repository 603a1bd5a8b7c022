"""Skip a ``draft_model`` drafter's forward on steps that draft nothing; catch its cache up later
(worker process, Model Runner V1).

vLLM runs a sequential drafter's first forward on every step, also when the scheduler asked
for no drafts at all (``num_spec_tokens_to_schedule == 0``): that forward only writes the
drafter's KV cache for the step's tokens.  On the testbed the forward and the runner's input
preparation for it are about two thirds of what a step at depth 0 costs over plain decoding.
With the controller on, such a step is common (the adaptive policy drafts nothing where its
drafts are unlikely to pay).

``SpecDecodeBaseProposer.propose`` (wrapped, for ``draft_model`` only; on a skipped step the
runner's ``propose_draft_token_ids`` returns before it prepares the drafter's inputs):
- ``num_speculative_tokens == 0``, no request of the batch would fall more than
  ``core.drafter_lag.DEFAULT_MAX_LAG`` positions behind and the batch's catch-up would still fit
  the drafter's token buffer in one forward: return no drafts without the forward
  (as vLLM's own K = 0 path returns; the runner's whole drafting step returns them as empty host
  lists, so no device copy or event follows) and record where each request's drafter cache stops;
- otherwise, before vLLM's first pass, prepend to each lagging request's query the positions its
  cache misses (tokens the target committed, from the runner's ``InputBatch``), with their
  positions and slots.  vLLM's first pass then writes them, as it would have step by step, and
  drafts from a whole cache.  Output is unchanged in either case (drafts are verified).

Limits (said at start-up): sync scheduling only (under async scheduling the runner's token
table lags the step); not under data parallel (each rank's drafter forward takes part in a
cross-rank exchange, so one rank may not skip it alone); not for drafters fed the target's
hidden states (EAGLE, MTP, DFlash: the skipped positions' hidden states are gone) or M-RoPE
drafters.  When a catch-up would overflow the drafter's token buffer the hole stays (drafts
there may be worse, never wrong) and is counted.  A block filled while its request lagged can
be reused by prefix caching before the catch-up: the same (drafts only) effect.
"""

from __future__ import annotations

import functools
import inspect
import logging
import weakref
from typing import Any

from dspark_dynamic.adapter.build import idle_drafter_skip_requested, worker_options
from dspark_dynamic.adapter.fail_open import FailOpen
from dspark_dynamic.adapter.patching import Patch, Where
from dspark_dynamic.core.drafter_lag import DrafterLag, Row

logger = logging.getLogger("vllm.dspark_dynamic")

PROPOSER_MODULE = "vllm.v1.spec_decode.llm_base_proposer"
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
ATTR = "_dspark_dynamic_drafter_skip"  # on a proposer: its DrafterSkip, or None when off
_SKIP = object()


def skip_wanted(vllm_config: Any) -> bool:
    """The configured controller asks for the idle drafter to be skipped."""
    options = worker_options(vllm_config)
    return options is not None and idle_drafter_skip_requested(options)


def why_not_skippable(proposer: Any, runner: Any) -> str | None:
    """Why this drafter's idle forward cannot be skipped, or None."""
    config = proposer.vllm_config
    if not config.speculative_config.uses_draft_model():
        return f"method {proposer.method!r} is not draft_model"
    if getattr(proposer, "pass_hidden_states_to_model", True) or getattr(proposer, "parallel_drafting", True):
        return "the drafter reads the target's hidden states or drafts in parallel"
    if not getattr(proposer, "needs_extra_input_slots", False):
        return "the drafter's first pass has no extra input slot"
    if getattr(proposer, "uses_mrope", False):
        return "the drafter uses M-RoPE positions"
    if getattr(getattr(config, "parallel_config", None), "data_parallel_size", 1) > 1:
        return "data parallel (every rank's drafter forward joins one cross-rank padding exchange)"
    if getattr(config.scheduler_config, "async_scheduling", False):
        return "async scheduling (the runner's token table lags the step; --no-async-scheduling enables it)"
    if runner is None:
        return "the drafter was built without its model runner"
    return None


class DrafterSkip:
    """One drafter's lag bookkeeping, the runner it reads committed tokens from, and the room its
    token buffer has for a catch-up (``buffer``: the drafter's ``max_num_tokens``; ``per_row``:
    what each request's own query may take next step besides)."""

    __slots__ = ("lag", "runner", "lost_positions", "buffer", "per_row")

    def __init__(self, runner: Any, lag: DrafterLag | None = None, buffer: int | None = None,
                 per_row: int = 0) -> None:
        self.lag = lag if lag is not None else DrafterLag()  # (an empty lag is falsy)
        self.runner = weakref.ref(runner)
        self.lost_positions = 0  # catch-ups that did not fit the drafter's buffer
        self.buffer = buffer
        self.per_row = per_row

    def rows(self, cad: Any) -> list[Row]:
        """The step's rows, from host data (the batch's computed tokens, the query start offsets)."""
        qsl = cad.query_start_loc_cpu.numpy()[: cad.num_reqs + 1].tolist()
        return self.rows_of([b - a for a, b in zip(qsl, qsl[1:])])

    def rows_of(self, lengths: list[int]) -> list[Row]:
        """The rows of the batch's first ``len(lengths)`` requests with these query lengths (their
        starts: the runner's computed tokens)."""
        input_batch = self.runner().input_batch
        starts = input_batch.num_computed_tokens_cpu[: len(lengths)].tolist()
        return [Row(req_id, start, n) for req_id, start, n in zip(input_batch.req_ids, starts, lengths)]

    def try_skip(self, cad: Any, rows: list[Row] | None = None) -> bool:
        """A step that drafts nothing: skip the drafter if no request would lag too far."""
        rows = self.rows(cad) if rows is None else rows
        lag = self.lag
        if len(lag) > len(rows):
            lag.prune(self.runner().requests)
        budget = None if self.buffer is None else self.buffer - len(rows) * self.per_row
        return lag.skip_if_allowed(rows, budget)

    def plan(self, proposer: Any, args: dict[str, Any]) -> Any:
        """``_SKIP``, None (vLLM's call as it is) or the arguments to replace (a catch-up)."""
        cad = args["common_attn_metadata"]
        rows = self.rows(cad)
        if args["num_speculative_tokens"] == 0 and self.try_skip(cad, rows):
            return _SKIP
        lag = self.lag
        catch = lag.catch_up(rows)
        total = sum(catch)
        if not total:
            return None
        if cad.num_actual_tokens + total + len(rows) * proposer.extra_slots_per_request > proposer.max_num_tokens:
            self.lost_positions += total
            logger.debug("dspark_dynamic: drafter catch-up of %d positions does not fit; skipped", total)
            return None
        return extend_queries(proposer, self.runner().input_batch.token_ids_cpu, rows, catch, args)


def extend_queries(proposer: Any, token_table: Any, rows: list[Row], catch: list[int],
                   args: dict[str, Any]) -> dict[str, Any]:
    """The first-pass arguments with ``catch[i]`` committed positions before row i's query:
    token ids from ``token_table`` (the runner's ``[requests, positions]`` ids), positions, and
    slots from the block table; sequence lengths are unchanged (only the query grows back)."""
    import torch

    cad = args["common_attn_metadata"]
    ids, positions = args["target_token_ids"], args["target_positions"]
    device = ids.device
    qsl = cad.query_start_loc_cpu[: len(rows) + 1].tolist()
    id_parts, pos_parts, lengths = [], [], []
    for i, (row, n) in enumerate(zip(rows, catch)):
        a, b = qsl[i], qsl[i + 1]
        if n:
            lo = row.start - n
            id_parts.append(torch.as_tensor(token_table[i, lo:row.start]).to(device=device, dtype=ids.dtype))
            pos_parts.append(torch.arange(lo, row.start, device=device, dtype=positions.dtype))
        id_parts.append(ids[a:b])
        pos_parts.append(positions[a:b])
        lengths.append(b - a + n)
    new_ids = torch.cat(id_parts)
    new_positions = torch.cat(pos_parts)
    lens = torch.tensor(lengths, dtype=torch.int32)
    qsl_cpu = torch.zeros(len(rows) + 1, dtype=torch.int32)
    torch.cumsum(lens, dim=0, out=qsl_cpu[1:])
    block_size = proposer.block_size
    req_index = torch.repeat_interleave(torch.arange(len(rows), device=device), lens.to(device))
    blocks = cad.block_table_tensor[req_index, new_positions // block_size]
    slots = (blocks * block_size + new_positions % block_size).to(cad.slot_mapping.dtype)
    new_cad = cad.replace(
        query_start_loc=qsl_cpu.to(device),
        query_start_loc_cpu=qsl_cpu,
        num_actual_tokens=int(qsl_cpu[-1]),
        max_query_len=max(lengths),
        slot_mapping=slots,
        positions=None,
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
    )
    return {"target_token_ids": new_ids, "target_positions": new_positions, "common_attn_metadata": new_cad}


def argument_reader(signature: inspect.Signature, name: str):
    """``read(args, kwargs)``: the argument ``name`` of a call of a method with ``signature``
    (``args`` without ``self``), without binding the whole call (``Signature.bind`` costs tens of
    microseconds, on a path that runs every engine step)."""
    names = list(signature.parameters)
    if name not in names:
        raise TypeError(f"no parameter {name!r} in {signature}")
    index = names.index(name) - 1  # args exclude self

    def read(args: tuple, kwargs: dict) -> Any:
        return args[index] if index < len(args) else kwargs[name]

    return read


# Faults here detach the skip from that drafter only: vLLM runs its forward every step again.
GUARD = FailOpen(ATTR, fallback="this drafter runs its forward on every step (vLLM's own behaviour)")


def _attach(proposer: Any, runner: Any) -> None:
    if not skip_wanted(getattr(proposer, "vllm_config", None)):
        return
    why_not = why_not_skippable(proposer, runner)
    if why_not is not None:
        logger.info("dspark_dynamic: the drafter's forward runs on every step (%s)", why_not)
        return
    buffer = getattr(proposer, "max_num_tokens", None)
    per_row = 1 + getattr(proposer, "num_speculative_tokens", 0) + getattr(proposer, "extra_slots_per_request", 0)
    proposer.__dict__[ATTR] = DrafterSkip(runner, buffer=buffer if isinstance(buffer, int) else None, per_row=per_row)
    logger.info("dspark_dynamic: %s skips its forward on steps that draft nothing (cache caught up "
                "within %d positions)", type(proposer).__name__, proposer.__dict__[ATTR].lag.max_lag)


def _init(original):
    where = "SpecDecodeBaseProposer.__init__"
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.__dict__[ATTR] = None
        try:
            runner = signature.bind(self, *args, **kwargs).arguments.get("runner")
            _attach(self, runner)
        except Exception as exc:
            GUARD.trip(self, where, exc)

    return __init__


def _propose(original):
    where = "SpecDecodeBaseProposer.propose"
    signature = inspect.signature(original)

    @functools.wraps(original)
    def propose(self, *args: Any, **kwargs: Any):
        state = self.__dict__.get(ATTR)
        if state is None:
            return original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
            plan = state.plan(self, bound.arguments)
        except Exception as exc:
            GUARD.trip(self, where, exc)
            return original(self, *args, **kwargs)
        if plan is None:
            return original(self, *args, **kwargs)
        if plan is _SKIP:  # what vLLM's K = 0 path returns, without its forward
            import torch

            self.num_speculative_tokens = 0
            self._last_draft_probs = None
            batch = bound.arguments["common_attn_metadata"].batch_size()
            return torch.empty(batch, 0, device=bound.arguments["next_token_ids"].device, dtype=torch.int64)
        bound.arguments.update(plan)
        return original(*bound.args, **bound.kwargs)

    return propose


def _runner_propose(original):
    """The runner's whole drafting step (next-token and input preparation, then the proposer)
    is skipped when the proposer would skip: in sync scheduling its outputs feed the drafter
    only."""
    where = "GPUModelRunner.propose_draft_token_ids"
    read_cad = argument_reader(inspect.signature(original), "common_attn_metadata")

    @functools.wraps(original)
    def propose_draft_token_ids(self, *args: Any, **kwargs: Any):
        drafter = getattr(self, "drafter", None)
        state = getattr(drafter, "__dict__", {}).get(ATTR)
        if state is None or getattr(args[0] if args else kwargs.get("scheduler_output"),
                                    "num_spec_tokens_to_schedule", None) != 0:
            return original(self, *args, **kwargs)
        try:
            cad = read_cad(args, kwargs)
            skip = state.try_skip(cad)
        except Exception as exc:
            GUARD.trip(drafter, where, exc)
            skip = False
        if not skip:
            return original(self, *args, **kwargs)
        self._draft_probs = None  # what vLLM's method resets before drafting
        self._draft_prob_req_ids = None
        # no drafts as host lists (vLLM's form for host drafters): nothing to copy back, no event
        # to wait on; the scheduler cleared every request's drafts when it scheduled the step
        return []

    return propose_draft_token_ids


P = "v1/spec_decode/llm_base_proposer.py"
R = "v1/worker/gpu_model_runner.py"

PATCHES = (
    Patch(
        "drafter-skip-init",
        PROPOSER_MODULE,
        "SpecDecodeBaseProposer.__init__",
        _init,
        params=("vllm_config", "runner"),
        why="keep the model runner (committed tokens) and the lag bookkeeping of a draft_model drafter",
        process="worker",
        where=Where(f"{P}:62", f"{P}:73", f"{P}:74", v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {P})"),
        removable_when="same as drafter-skip-propose",
    ),
    Patch(
        "drafter-skip-propose",
        PROPOSER_MODULE,
        "SpecDecodeBaseProposer.propose",
        _propose,
        params=("num_speculative_tokens", "target_token_ids", "target_positions", "next_token_ids",
                "common_attn_metadata"),
        why="skip the draft_model forward when no request drafts; prepend the skipped positions to the next first pass",
        process="worker",
        where=Where(f"{P}:509 (K = 0: forward :589, empty drafts :606)", f"{P}:512 (K = 0: forward :600, empty drafts :617-627)",
                    f"{P}:511", v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {P})"),
        removable_when="vLLM skips the drafter at K = 0 and catches its cache up (its dynamic SD still runs the forward)",
    ),
    Patch(
        "drafter-skip-runner-propose",
        RUNNER_MODULE,
        "GPUModelRunner.propose_draft_token_ids",
        _runner_propose,
        params=("scheduler_output", "common_attn_metadata"),
        why="on a skipped step, skip the runner's next-token and input preparation for the drafter too",
        process="worker",
        where=Where(f"{R}:4852", f"{R}:4748", f"{R}:4714", v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {R})"),
        removable_when="same as drafter-skip-propose",
    ),
)

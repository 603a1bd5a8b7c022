"""A DFlash drafter asked for no drafts writes its context and skips its forward (worker process,
Model Runner V1).

vLLM's DFlash (``vllm/v1/spec_decode/dflash.py``) does two things in a step's first pass: it
projects the target's hidden states of the tokens the step processed into the drafter's KV
cache (the *context*, ``build_model_inputs_first_pass`` -> ``precompute_and_store_context_kv``),
then runs one forward over the query block ``[x, M, ..., M]`` at the positions after them and
reads the drafts off its logits.  At ``num_speculative_tokens == 0`` vLLM still runs that
forward and discards it.  Only the context lasts: the block's keys and values sit at positions
the target has not processed yet, and the next step's context overwrites them there before any
query reads them.

``DFlashProposer.propose`` (wrapped; the class inherits ``SpecDecodeBaseProposer.propose``): at
``num_speculative_tokens == 0``, run vLLM's own ``set_inputs_first_pass`` (the context's
positions and slots), then return what vLLM's K = 0 path returns (no drafts), without the
attention metadata, the forward or the logits.  The context itself is held back
(``HeldContext``): the target's hidden states, positions and slots of each idle step, written in
one batch by vLLM's own ``combine_hidden_states`` and ``precompute_and_store_context_kv``
before the drafter's next forward (a drafting step's propose) or once ``HOLD_TOKENS`` are
held.  Both are row by row (a projection, norms, RoPE at the row's position, a write to its
slot), and a slot written twice keeps its later row, so the cache the next forward reads is
the one vLLM's step-by-step writes leave; drafts and output are unchanged.  Where this vLLM's
proposer lacks the buffers the hold reads, or a KV connector may save or send the drafter's
cache after any step, each idle step writes its context at once (``build_model_inputs_first_pass``,
as vLLM does).

``GPUModelRunner.propose_draft_token_ids`` (wrapped): where the context is held, an idle step
does not build vLLM's drafting inputs either (the next tokens, the padded batch's sample
indices, the fused first-pass kernel: the query block it lays out is never read).  It holds the
rows vLLM's padded path hands the drafter as context: every token the step processed, its
target's auxiliary hidden states and position, and its slot, looked up in the block table as
vLLM's first-pass kernel looks it up (``context_slots``).  Only with sync scheduling (the
next tokens' counts are copied out for the next step only under async scheduling), the padded
drafter batch, no multimodal or M-RoPE inputs and no target override of the drafter's hidden
states; otherwise vLLM's path runs and the proposer's wrapper holds the same rows.

Limits: not under data parallel (every rank's drafter forward takes part in one cross-rank
padding exchange, so one rank may not skip it alone).  Model Runner V2 (vLLM 0.34, DSpark on
the fork) drafts elsewhere: there the drafter runs at depth 0 and the cost model knows it
(``adapter.build.expects_context_only``).  Nothing happens unless the controller is configured
with ``skip_idle_drafter`` (the default) and drafts bound to its plans.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from dspark_dynamic.adapter.fail_open import FailOpen
from dspark_dynamic.adapter.patches.drafter_skip import argument_reader, skip_wanted
from dspark_dynamic.adapter.patching import Patch, Where

logger = logging.getLogger("vllm.dspark_dynamic")

DFLASH_MODULE = "vllm.v1.spec_decode.dflash"
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
ATTR = "_dspark_dynamic_dflash_context"  # on a proposer: True when it skips idle forwards, else None
# what the context-only pass calls (vLLM's own methods, in vLLM's order): on the model, then on
# the proposer
MODEL_NEEDS = ("combine_hidden_states",)
PROPOSER_NEEDS = ("set_inputs_first_pass", "build_model_inputs_first_pass")
# what holding the context reads: the context's position and slot buffers, as
# ``set_inputs_first_pass`` leaves them for ``build_model_inputs_first_pass`` (with the context's
# size, ``_dflash_num_context``, which it sets on its first call); the model's writer
HOLD_NEEDS = ("_context_positions_buffer", "_context_slot_mapping_buffer")
HOLD_MODEL_NEEDS = ("precompute_and_store_context_kv",)
RUNNER_HOLDS = "_dspark_dynamic_runner_holds"  # on a runner: whether its idle steps hold the context (once decided)
HELD = "_dspark_dynamic_held_context"  # on a proposer: its ``HeldContext`` (None: written at once)
# Context rows held before they are written anyway (speed: one batched write instead of one per
# idle step; memory: this many rows of the target's hidden states; not a policy constant)
HOLD_TOKENS = 256

GUARD = FailOpen(ATTR, fallback="this DFlash drafter runs its forward on every step (vLLM's own behaviour)")


def why_not_context_only(proposer: Any) -> str | None:
    """Why this DFlash drafter's idle forward cannot be skipped, or None."""
    config = proposer.vllm_config
    if getattr(getattr(config, "parallel_config", None), "data_parallel_size", 1) > 1:
        return "data parallel (every rank's drafter forward joins one cross-rank padding exchange)"
    model = getattr(proposer, "model", None)
    missing = ([name for name in MODEL_NEEDS if not callable(getattr(model, name, None))]
               + [name for name in PROPOSER_NEEDS if not callable(getattr(proposer, name, None))])
    if missing:
        return f"this vLLM's DFlash proposer lacks {missing}"
    return None


def _enabled(proposer: Any) -> bool:
    """Decided on the first call (the model is loaded by then), kept on the proposer."""
    state = proposer.__dict__.get(ATTR, False)
    if state is not False:
        return bool(state)
    proposer.__dict__[ATTR] = None
    if not skip_wanted(getattr(proposer, "vllm_config", None)):
        return False
    why_not = why_not_context_only(proposer)
    if why_not is not None:
        logger.info("dspark_dynamic: the DFlash drafter's forward runs on every step (%s)", why_not)
        return False
    proposer.__dict__[ATTR] = True
    # not with a KV connector: it may save or send the drafter's cache at the end of any step
    holds = (getattr(proposer.vllm_config, "kv_transfer_config", None) is None
             and all(hasattr(proposer, name) for name in HOLD_NEEDS)
             and all(callable(getattr(proposer.model, name, None)) for name in HOLD_MODEL_NEEDS))
    proposer.__dict__[HELD] = HeldContext() if holds else None
    logger.info("dspark_dynamic: %s writes only its context on steps that draft nothing (no forward; %s)",
                type(proposer).__name__,
                "the context written in batches before its next forward" if holds else "the context written at once")
    return True


class HeldContext:
    """Context rows of idle steps not yet in the drafter's cache: per step, the target's hidden
    states (before ``combine_hidden_states``), positions and slots, in step order.

    ``write`` puts them in with one call of the model's own writer; where a slot was held twice,
    only its later row is written (what step-by-step writes leave there)."""

    def __init__(self) -> None:
        self.states: list[Any] = []
        self.positions: list[Any] = []
        self.slots: list[Any] = []
        self.rows = 0

    def hold(self, states: Any, positions: Any, slots: Any) -> None:
        # copies: the proposer's buffers (and the runner's, on some paths) are reused next step
        self.hold_owned(states.clone(), positions.clone(), slots.clone())

    def hold_owned(self, states: Any, positions: Any, slots: Any) -> None:
        """``hold`` for tensors no one else writes to (made for the hold)."""
        self.states.append(states)
        self.positions.append(positions)
        self.slots.append(slots)
        self.rows += int(positions.shape[0])

    def write(self, proposer: Any) -> None:
        if not self.rows:
            return
        import torch

        states, positions, slots = (torch.cat(x) if len(x) > 1 else x[0] for x in (self.states, self.positions, self.slots))
        self.states, self.positions, self.slots, self.rows = [], [], [], 0
        unique, inverse = torch.unique(slots, return_inverse=True)
        if unique.shape[0] < slots.shape[0]:  # a slot held twice: its later row only, rows in step order
            order = torch.arange(slots.shape[0], device=slots.device)
            last = torch.full_like(unique, -1, dtype=order.dtype).scatter_reduce_(0, inverse, order, reduce="amax")
            keep = torch.sort(last).values
            states, positions, slots = states[keep], positions[keep], slots[keep]
        model = proposer.model
        model.precompute_and_store_context_kv(model.combine_hidden_states(states), positions, slots)


# the propose arguments the context-only pass reads (vLLM's names)
ARGUMENTS = ("target_token_ids", "target_positions", "target_hidden_states", "next_token_ids",
             "token_indices_to_sample", "common_attn_metadata")


def context_only(proposer: Any, arguments: dict[str, Any]) -> Any:
    """vLLM's first pass up to the context K/V, then vLLM's K = 0 result (no drafts)."""
    import torch

    cad = arguments["common_attn_metadata"]
    proposer.num_speculative_tokens = 0
    proposer._last_draft_probs = None
    held = proposer.__dict__.get(HELD)
    states = arguments["target_hidden_states"]
    # held: the states are combined when written (set_inputs_first_pass only keeps them for
    # build_model_inputs_first_pass, which is not called then)
    hidden = states if held is not None else proposer.model.combine_hidden_states(states)
    num_tokens, _indices, _cad = proposer.set_inputs_first_pass(
        target_token_ids=arguments["target_token_ids"],
        next_token_ids=arguments["next_token_ids"],
        target_positions=arguments["target_positions"],
        target_hidden_states=hidden,
        token_indices_to_sample=arguments["token_indices_to_sample"],
        cad=cad,
        num_rejected_tokens_gpu=arguments.get("num_rejected_tokens_gpu"),
    )
    if held is None:
        proposer.build_model_inputs_first_pass(num_tokens, num_tokens, None)  # writes the context
    else:
        n = proposer._dflash_num_context
        held.hold(states[:n], proposer._context_positions_buffer[:n], proposer._context_slot_mapping_buffer[:n])
        if held.rows >= HOLD_TOKENS:
            held.write(proposer)
    device = arguments["next_token_ids"].device
    return torch.empty(cad.batch_size(), 0, device=device, dtype=torch.int64)


def _propose(original):
    """vLLM's propose is called at most once, outside the plugin's ``try`` (its own errors pass
    through); the plugin's part reads the arguments without binding the call (on every idle step)."""
    where = "DFlashProposer.propose"
    signature = inspect.signature(original)
    read_k = argument_reader(signature, "num_speculative_tokens")
    readers = {name: argument_reader(signature, name) for name in ARGUMENTS}
    read_rejected = argument_reader(signature, "num_rejected_tokens_gpu")

    @functools.wraps(original)
    def propose(self, *args: Any, **kwargs: Any):
        result = None
        try:
            k = read_k(args, kwargs)
            held = self.__dict__.get(HELD)
            if k and held is not None and held.rows:  # the idle steps' context, before the forward reads it
                held.write(self)
            if k == 0 and _enabled(self):
                arguments = {name: read(args, kwargs) for name, read in readers.items()}
                try:
                    arguments["num_rejected_tokens_gpu"] = read_rejected(args, kwargs)
                except (IndexError, KeyError):  # a default argument left out
                    arguments["num_rejected_tokens_gpu"] = None
                result = context_only(self, arguments)
        except Exception as exc:  # vLLM redoes this step's context; a held one not written is lost
            self.__dict__[HELD] = None
            GUARD.trip(self, where, exc)
        return original(self, *args, **kwargs) if result is None else result

    return propose


def context_slots(positions: Any, cad: Any, block_size: int) -> Any:
    """Each context row's KV slot, as vLLM's DFlash first-pass kernel computes it: the row's
    request (from ``query_start_loc``), its block ``position // block_size`` clamped to the
    block table's last column, ``block * block_size + position % block_size``."""
    import torch

    table = cad.block_table_tensor
    num_reqs = cad.num_reqs
    starts = cad.query_start_loc_cpu[: num_reqs + 1]
    rows = torch.repeat_interleave(starts[1:] - starts[:-1]).to(table.device)
    last_column = min(table.stride(0), table.shape[1]) - 1
    blocks = torch.clamp(positions // block_size, max=last_column)
    return table[rows, blocks].to(torch.int64) * block_size + positions % block_size


def runner_may_hold(runner: Any) -> bool:
    """This runner's idle steps may hold the context themselves (see the module docstring): what
    it reads is fixed for the runner's life, so it is decided once and kept on the runner."""
    allowed = runner.__dict__.get(RUNNER_HOLDS)
    if allowed is None:
        drafter = runner.drafter
        allowed = runner.__dict__[RUNNER_HOLDS] = not (
            getattr(runner.speculative_config, "disable_padded_drafter_batch", True)
            or getattr(runner, "valid_sampled_token_count_event", None) is not None
            or not getattr(runner, "use_aux_hidden_state_outputs", False)
            or getattr(runner, "uses_mrope", False)
            or (getattr(runner, "supports_mm_inputs", False) and getattr(drafter, "supports_mm_inputs", False))
            or getattr(runner.get_model(), "get_mtp_target_hidden_states", None) is not None)
        if allowed:
            logger.info("dspark_dynamic: an idle DFlash drafter's steps hold its context without vLLM's drafting inputs")
    return allowed


def held_by_runner(runner: Any, scheduler_output: Any, aux_hidden_states: Any) -> Any:
    """The drafter's ``HeldContext`` when this step may hold its context at the runner, else None."""
    if getattr(scheduler_output, "num_spec_tokens_to_schedule", None) != 0:
        return None
    state = getattr(getattr(runner, "drafter", None), "__dict__", {})
    held = state.get(HELD)
    if state.get(ATTR) is not True or held is None or aux_hidden_states is None or not runner_may_hold(runner):
        return None
    return held


def _runner_propose(original):
    where = "GPUModelRunner.propose_draft_token_ids"
    signature = inspect.signature(original)
    readers = {name: argument_reader(signature, name)
               for name in ("scheduler_output", "aux_hidden_states", "common_attn_metadata")}

    @functools.wraps(original)
    def propose_draft_token_ids(self: Any, *args: Any, **kwargs: Any):
        result = None
        try:
            scheduler_output, aux, cad = (read(args, kwargs) for read in readers.values())
            held = held_by_runner(self, scheduler_output, aux)
            if held is not None:
                import torch

                drafter = self.drafter
                n = scheduler_output.total_num_scheduled_tokens
                positions = self._get_positions(n)
                held.hold_owned(torch.cat([h[:n] for h in aux], dim=-1), positions.clone(),
                                context_slots(positions, cad, drafter.block_size))
                if held.rows >= HOLD_TOKENS:
                    held.write(drafter)
                self._draft_probs = None
                if hasattr(self, "_draft_prob_req_ids"):
                    self._draft_prob_req_ids = None
                drafter._last_draft_probs = None
                result = torch.empty(cad.batch_size(), 0, device=positions.device, dtype=torch.int64)
        except Exception as exc:  # vLLM's path runs this step; a held context not written is lost
            drafter = getattr(self, "drafter", None)
            if drafter is not None:
                drafter.__dict__[HELD] = None
                GUARD.trip(drafter, where, exc)
            result = None
        return original(self, *args, **kwargs) if result is None else result

    return propose_draft_token_ids


D = "v1/spec_decode/dflash.py"
R = "v1/worker/gpu_model_runner.py"
P = "v1/spec_decode/llm_base_proposer.py"

PATCHES = (
    Patch(
        "dflash-context-only",
        DFLASH_MODULE,
        "DFlashProposer.propose",
        _propose,
        params=("num_speculative_tokens", "target_token_ids", "target_positions", "target_hidden_states",
                "next_token_ids", "token_indices_to_sample", "common_attn_metadata"),
        why="a DFlash drafter asked for no drafts writes its context K/V and skips the forward vLLM discards",
        process="worker",
        where=Where(f"{P}:509, inherited (K = 0: forward :589, empty :606; context {D}:270)",
                    f"{P}:512, inherited (K = 0: forward :600, empty :620; context {D}:283)",
                    f"{P}:511, inherited (K = 0: forward :599, empty :619; context {D}:283)",
                    v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {D})"),
        removable_when="vLLM's DFlash skips the forward when no drafts are asked for",
    ),
    Patch(
        "dflash-idle-step",
        RUNNER_MODULE,
        "GPUModelRunner.propose_draft_token_ids",
        _runner_propose,
        params=("scheduler_output", "aux_hidden_states", "common_attn_metadata"),
        why="an idle DFlash drafter's step holds its context without vLLM's drafting inputs (next tokens, padded "
            "batch, first-pass kernel)",
        process="worker",
        where=Where(f"{R}:4852", f"{R}:4748", f"{R}:4714",
                    v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {R})"),
        removable_when="vLLM's runner skips the drafting inputs of a step that drafts nothing",
    ),
)

"""Draft confidences for DSpark on Model Runner V2 (the fork, vLLM 0.32-0.34): computed inside
the captured draft step, carried with the draft ids to the scheduler.

Capture (GPU worker, ``DSparkSpeculator``): the whole draft step, ``_generate_draft``, is what
vLLM captures and replays as a FULL CUDA graph, so the feature is computed *by the tensor ops
recorded while that step is traced*, into a persistent ``[max_num_reqs, N]`` float32 buffer
allocated in the speculator's constructor (before the profile run and before capture).  The
feature is ``confidence.max_prob_log_odds`` of each draft position's logits (``logits_i``, the
base logits plus that position's Markov bias) at the request's temperature (the speculator's
``temperature`` buffer, indexed by the persistent request slot, as its sampler does), clamped
to +-40; or, on the fork, the checkpoint's confidence head (a raw logit) when the checkpoint
index lists its weights (the fork loads ``mtp.*.confidence_head.*`` without checking, so an
absent head would be uninitialised memory).  Where ``logits_i`` is seen:
- vLLM 0.32-0.34: the per-position sampler ``_sample_logits(logits_i, idx_map, ..., step[,
  bias])`` (0.34 may pass the Markov bias separately, for the fused Gumbel kernel: the
  feature then scores ``logits + bias``, the distribution the kernel samples);
- the fork, which forms and samples ``logits_i`` inline: while ``_generate_draft`` runs, the
  draft model's ``compute_logits`` (base logits) and ``markov_bias`` are shadowed on the model
  instance, and after the i-th bias the feature of ``base[:, i] + bias`` is written, the sum
  the loop forms next (for the head: ``markov_embed`` and the sampled hidden states instead).
Every traced (or eager) draft step is checked: all N columns of all its rows must have been
written, else capture switches off for that speculator (a model with its own fused sampling
kernels, vLLM 0.34's TP batch-sharded Markov loop).  Replays run the ops of a checked trace.

Transport (sync scheduling only; vLLM never calls ``take_draft_token_ids`` under async
scheduling, so capture is off there): ``propose`` marks its ``InputBatch``; the runner's next
``DraftTokensHandler.set_draft_tokens(input_batch, ...)`` enqueues the D2H copy of the batch's
rows on the handler's own copy stream after the draft step and re-records the handler's copy
event (which then also covers the draft ids it copies for structured outputs).
``get_draft_tokens`` (what ``take_draft_token_ids`` returns) waits on that one event and
attaches the rows to the ``DraftTokenIds`` as ``confidence.FIELD``, one list per request in its
``req_ids`` order (None for a request of vLLM 0.34's handler that has no row from the last
step), which the scheduler patch ``confidence-update-draft-token-ids`` hands to the controller.

Faults (worker side, so they cannot detach the scheduler's controller): any exception in the
plugin's part of these patches is logged once with its traceback and switches capture off for
that speculator; vLLM's step always goes on, and the controller carries on without confidences
(its acceptance estimates), as for a drafter that has none.

Nothing happens unless ``additional_config["dspark_dynamic"]`` asks for the adaptive policy
with confidences (``confidence.confidence_wanted``) and scheduling is synchronous.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import struct
from typing import Any

from dspark_dynamic.adapter.patches.confidence import FIELD, confidence_wanted, max_prob_log_odds
from dspark_dynamic.adapter.patching import Patch, Where
from dspark_dynamic.core.confidence import FEATURE_CLAMP

logger = logging.getLogger("vllm.dspark_dynamic")

SPECULATOR_MODULE = "vllm.v1.worker.gpu.spec_decode.dspark.speculator"
HANDLER_MODULE = "vllm.v1.worker.gpu.spec_decode.utils"
ATTR = "_dspark_dynamic_confidence_v2"  # on a speculator: its DraftConfidences or None; on an InputBatch: the same
PENDING = "_dspark_dynamic_confidence_rows"  # on a DraftTokensHandler: the last step's rows in flight, or None

PER_POSITION = "sample_logits"  # vLLM 0.32-0.34: the speculator's per-position sampler sees logits_i
INLINE = "markov_bias"  # the fork: logits_i = base[:, i] + markov_bias(...), sampled inline
LOGITS_CALLS = ("compute_logits", "compute_draft_logits")  # the draft model's base-logits callables
HEAD_KEY = re.compile(r"(?:^|\.)mtp\.\d+\.confidence_head\.proj\.weight$")


class DraftConfidences:
    """One speculator's feature buffer ([max_num_reqs, N] fp32, batch rows) and the draft step
    being traced."""

    __slots__ = ("buf", "mode", "use_head", "off", "trace")

    def __init__(self, buf: Any, mode: str, use_head: bool = False) -> None:
        self.buf = buf
        self.mode = mode
        self.use_head = use_head
        self.off = False
        self.trace: _Trace | None = None


class _Trace:
    """What one run of ``_generate_draft`` recorded."""

    __slots__ = ("num_reqs", "columns", "position", "base", "hidden", "embeds", "bad")

    def __init__(self, num_reqs: int) -> None:
        self.num_reqs = num_reqs
        self.columns: set[int] = set()
        self.position = 0
        self.base: Any = None
        self.hidden: Any = None
        self.embeds: list[Any] = []
        self.bad: str | None = None


def _switch_off(speculator: Any, why: str) -> None:
    state = speculator.__dict__.get(ATTR)
    if state is not None and not state.off:
        state.off = True
        logger.warning("dspark_dynamic: DSpark draft confidences are off: %s", why)


# ---- setup ---------------------------------------------------------------------------------


def _safetensors_names(path: str) -> list[str]:
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return [k for k in json.loads(f.read(size)) if k != "__metadata__"]


def _checkpoint_file(model: str, name: str, revision: str | None) -> str | None:
    if os.path.isdir(model):
        path = os.path.join(model, name)
        return path if os.path.isfile(path) else None
    try:  # the local Hugging Face cache only: never the network
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(model, name, revision=revision)
    except Exception:
        return None
    return path if isinstance(path, str) and os.path.isfile(path) else None


def checkpoint_has_confidence_head(model: str | None, revision: str | None = None) -> bool | None:
    """Whether the checkpoint lists ``mtp.<i>.confidence_head.proj.weight`` (its safetensors
    index, or its single safetensors file's header); None when neither can be read locally."""
    if not model:
        return None
    try:
        index = _checkpoint_file(model, "model.safetensors.index.json", revision)
        if index is not None:
            with open(index) as f:
                names = list(json.load(f).get("weight_map", {}))
        else:
            single = _checkpoint_file(model, "model.safetensors", revision)
            if single is None:
                return None
            names = _safetensors_names(single)
    except Exception:
        logger.debug("dspark_dynamic: could not read the checkpoint index of %s", model, exc_info=True)
        return None
    return any(HEAD_KEY.search(name) for name in names)


def v2_confidence_wanted(vllm_config: Any) -> bool:
    """The adaptive policy wants confidences and scheduling is synchronous."""
    if not confidence_wanted(vllm_config):
        return False
    if getattr(getattr(vllm_config, "scheduler_config", None), "async_scheduling", False):
        logger.info(
            "dspark_dynamic: no DSpark draft confidences under async scheduling (vLLM hands draft "
            "ids to the scheduler only with --no-async-scheduling); the policy keeps its estimates"
        )
        return False
    return True


def setup(speculator: Any, vllm_config: Any) -> DraftConfidences | None:
    """Attach the buffer to a constructed DSpark speculator when confidences are wanted."""
    speculator.__dict__[ATTR] = None
    if not v2_confidence_wanted(vllm_config):
        return None
    import torch

    mode = PER_POSITION if hasattr(type(speculator), "_sample_logits") else INLINE
    use_head = False
    if mode == INLINE:  # the fork computes no confidences itself; vLLM >= 0.33 does with AV
        draft = getattr(getattr(vllm_config, "speculative_config", None), "draft_model_config", None)
        found = checkpoint_has_confidence_head(getattr(draft, "model", None), getattr(draft, "revision", None))
        use_head = found is True
        logger.info(
            "dspark_dynamic: DSpark confidence head %s",
            "weights found in the checkpoint index: using it" if use_head
            else ("absent from the checkpoint" if found is False else "not checkable (no local index)")
            + ": using the max-probability log-odds",
        )
    buf = torch.zeros(speculator.max_num_reqs, speculator.num_speculative_steps, dtype=torch.float32,
                      device=speculator.device)
    state = DraftConfidences(buf, mode, use_head)
    speculator.__dict__[ATTR] = state
    logger.info("dspark_dynamic: DSpark draft confidences computed in the draft step (%s)", mode)
    return state


# ---- capture (inside the captured draft step) ----------------------------------------------


def _record_position(speculator: Any, state: DraftConfidences, trace: _Trace, logits: Any, idx_map: Any,
                     column: int) -> None:
    """Write one position's features for the trace's rows (graph-safe tensor ops only)."""
    n = trace.num_reqs
    if logits.dim() != 2 or logits.shape[0] != n or not 0 <= column < state.buf.shape[1]:
        trace.bad = f"position {column}: logits {tuple(logits.shape)} for {n} rows"
        return
    temperature = speculator.temperature[idx_map.long().clamp(min=0)]  # padded rows (-1): any slot
    state.buf[:n, column].copy_(max_prob_log_odds(logits, temperature))
    trace.columns.add(column)


def _safely(trace: _Trace, what: str, fn, *args: Any) -> None:
    """A recording failure marks the trace bad (capture switches off, logged once with its
    traceback); vLLM's step goes on.  Nothing more is recorded into a bad trace."""
    if trace.bad is not None:
        return
    try:
        fn(*args)
    except Exception as exc:
        logger.exception("dspark_dynamic: recording DSpark draft confidences (%s) failed", what)
        trace.bad = f"{what}: {type(exc).__name__}: {exc}"


def _shadow_model(speculator: Any, state: DraftConfidences, trace: _Trace, saved: dict[str, Any]) -> None:
    """Shadow the draft model's per-step callables on the instance for one draft step; what to
    restore goes into ``saved`` as it is shadowed (complete even if this raises midway)."""
    model = speculator.model
    n_spec = speculator.num_speculative_steps

    def shadow(name: str, make) -> None:
        original = getattr(model, name, None)
        if callable(original):
            saved[name] = model.__dict__.get(name, _MISSING)
            model.__dict__[name] = make(original)

    def logits_call(original):
        def call(hidden: Any, *args: Any, **kwargs: Any):
            out = original(hidden, *args, **kwargs)
            trace.base, trace.hidden, trace.position = out, hidden, 0  # the last (outermost) call wins
            trace.embeds = []
            return out

        return call

    def markov_embed(original):
        def call(*args: Any, **kwargs: Any):
            out = original(*args, **kwargs)
            trace.embeds.append(out)
            return out

        return call

    def markov_bias(original):
        def call(*args: Any, **kwargs: Any):
            bias = original(*args, **kwargs)
            i = trace.position
            trace.position += 1
            if not state.use_head:
                _safely(trace, f"position {i}", _record_inline, speculator, state, trace, bias, i, n_spec)
            return bias

        return call

    for name in LOGITS_CALLS:
        shadow(name, logits_call)
    if state.use_head:
        shadow("markov_embed", markov_embed)
    shadow("markov_bias", markov_bias)


def _record_inline(speculator: Any, state: DraftConfidences, trace: _Trace, bias: Any, i: int, n_spec: int) -> None:
    n = trace.num_reqs
    if trace.base is None:
        trace.bad = "a Markov bias came before the base logits"
        return
    logits_i = trace.base.view(n, n_spec, -1)[:, i] + bias  # what the loop samples next
    idx_map = speculator.sample_idx_mapping[: n * n_spec].view(n, n_spec)[:, i]
    _record_position(speculator, state, trace, logits_i, idx_map, i)


def _record_head(speculator: Any, state: DraftConfidences, trace: _Trace) -> None:
    n, n_spec = trace.num_reqs, speculator.num_speculative_steps
    if trace.hidden is None or len(trace.embeds) != n_spec:
        trace.bad = f"{len(trace.embeds)} Markov embeddings for {n_spec} positions"
        return
    import torch

    embeds = torch.stack(trace.embeds, dim=1).flatten(0, 1)  # (req, position) like the hidden rows
    logit = speculator.model.compute_confidence(trace.hidden, embeds).float().view(n, n_spec)
    state.buf[:n].copy_(logit.clamp(-FEATURE_CLAMP, FEATURE_CLAMP))
    trace.columns.update(range(n_spec))


_MISSING = object()


def _restore(model: Any, saved: dict[str, Any]) -> None:
    for name, before in saved.items():
        if before is _MISSING:
            model.__dict__.pop(name, None)
        else:
            model.__dict__[name] = before


def _generate_draft(original):
    @functools.wraps(original)
    def _generate_draft(self, num_reqs: int, *args: Any, **kwargs: Any):
        state = self.__dict__.get(ATTR)
        if state is None or state.off:
            return original(self, num_reqs, *args, **kwargs)
        if getattr(self, "_sharded_sequential_comm", None) is not None:  # vLLM 0.34, TP > 1
            _switch_off(self, "the Markov loop is batch-sharded across TP ranks (rows are not the batch's)")
            return original(self, num_reqs, *args, **kwargs)
        trace = _Trace(num_reqs)
        saved: dict[str, Any] = {}
        if state.mode == INLINE or state.use_head:
            try:
                _shadow_model(self, state, trace, saved)
            except Exception as exc:  # fail open: vLLM's own draft step, capture off
                logger.exception("dspark_dynamic: shadowing the DSpark draft model failed")
                _restore(self.model, saved)
                _switch_off(self, f"shadowing the draft model: {type(exc).__name__}: {exc}")
                return original(self, num_reqs, *args, **kwargs)
        state.trace = trace
        try:
            result = original(self, num_reqs, *args, **kwargs)
        finally:
            state.trace = None
            _restore(self.model, saved)
        if state.use_head and trace.bad is None:
            _safely(trace, "confidence head", _record_head, self, state, trace)
        if trace.bad is None and trace.columns != set(range(self.num_speculative_steps)):
            trace.bad = f"positions {sorted(trace.columns)} of {self.num_speculative_steps} written"
        if trace.bad is not None:
            _switch_off(self, trace.bad)
        return result

    return _generate_draft


def _sample_logits(original):
    @functools.wraps(original)
    def _sample_logits(self, logits: Any, idx_map: Any, sample_pos: Any, step: Any, *args: Any, **kwargs: Any):
        state = self.__dict__.get(ATTR)
        trace = state.trace if state is not None else None
        if trace is not None and state.mode == PER_POSITION and not state.use_head:
            bias = args[0] if args else kwargs.get("bias")  # vLLM 0.34: fused into the Gumbel kernel

            def record() -> None:
                formed = logits if bias is None else logits + bias
                _record_position(self, state, trace, formed, idx_map, int(step))

            _safely(trace, f"position {step}", record)  # before vLLM may scale the logits in place
        return original(self, logits, idx_map, sample_pos, step, *args, **kwargs)

    return _sample_logits


def _init(original):
    @functools.wraps(original)
    def __init__(self, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        original(self, vllm_config, *args, **kwargs)
        try:
            setup(self, vllm_config)
        except Exception:
            logger.exception("dspark_dynamic: DSpark draft-confidence buffer not set up; capture is off")
            self.__dict__[ATTR] = None

    return __init__


def _propose(original):
    @functools.wraps(original)
    def propose(self, *args: Any, **kwargs: Any):
        out = original(self, *args, **kwargs)
        state = self.__dict__.get(ATTR)
        if state is not None and not state.off and not kwargs.get("dummy_run", False):
            input_batch = args[0] if args else kwargs.get("input_batch")
            try:
                input_batch.__dict__[ATTR] = state  # read once by the handler's set_draft_tokens
            except Exception:
                pass
        return out

    return propose


# ---- transport (the handler's copy stream and event) ---------------------------------------


def _start_copy(handler: Any, state: DraftConfidences, input_batch: Any, width: int) -> None:
    rows = state.buf[: input_batch.num_reqs, :width]
    if rows.is_cuda:
        import torch

        handler.copy_stream.wait_stream(torch.cuda.current_stream(handler.device))
        with torch.cuda.stream(handler.copy_stream):
            host = rows.to("cpu", non_blocking=True)  # pinned; the buffer is persistent
            handler.copy_event.record()
    else:  # CPU tensors (structure tests): nothing in flight
        host = rows.clone()
    handler.__dict__[PENDING] = (list(input_batch.req_ids), host, rows.is_cuda, state)


def _set_draft_tokens(original):
    @functools.wraps(original)
    def set_draft_tokens(self, input_batch: Any, draft_tokens: Any, *args: Any, **kwargs: Any):
        result = original(self, input_batch, draft_tokens, *args, **kwargs)
        self.__dict__[PENDING] = None
        state = getattr(input_batch, "__dict__", {}).pop(ATTR, None)
        if state is not None and not state.off and draft_tokens.shape[1] > 0:
            try:
                _start_copy(self, state, input_batch, draft_tokens.shape[1])
            except Exception:
                logger.exception("dspark_dynamic: DSpark draft confidences not copied; capture is off")
                state.off = True
        return result

    return set_draft_tokens


def _get_draft_tokens(original):
    @functools.wraps(original)
    def get_draft_tokens(self, *args: Any, **kwargs: Any):
        out = original(self, *args, **kwargs)
        pending = self.__dict__.pop(PENDING, None)
        if out is None or pending is None:
            return out
        req_ids, host, in_flight, state = pending
        try:
            if in_flight:
                self.copy_event.synchronize()  # the handler's event: a no-op if vLLM just waited on it
            by_req = dict(zip(req_ids, host.tolist()))
            setattr(out, FIELD, [by_req.get(req_id) for req_id in out.req_ids])
        except Exception:
            logger.exception("dspark_dynamic: DSpark draft confidences not attached; capture is off")
            state.off = True
        return out

    return get_draft_tokens


S = "v1/worker/gpu/spec_decode/dspark/speculator.py"
DF = "v1/worker/gpu/spec_decode/dflash/speculator.py"
U = "v1/worker/gpu/spec_decode/utils.py"
_WHEN = "vLLM's DSpark speculator reports per-draft confidences without adaptive verification"

PATCHES = (
    Patch(
        "confidence-v2-init",
        SPECULATOR_MODULE,
        "DSparkSpeculator.__init__",
        _init,
        params=("vllm_config", "device"),
        why="allocate the persistent [max_num_reqs, N] fp32 confidence buffer before profiling and capture",
        process="GPU worker (Model Runner V2)",
        where=Where(f"{S}:44", f"{S}:43", f"{S}:43", v034=f"{S}:56"),
        removable_when=_WHEN,
    ),
    Patch(
        "confidence-v2-generate-draft",
        SPECULATOR_MODULE,
        "DSparkSpeculator._generate_draft",
        _generate_draft,
        params=("num_reqs",),
        why="trace the captured draft step: check every position was scored; on the fork shadow the "
        "draft model's compute_logits/markov_bias to score base[:, i] + bias (or run the confidence head)",
        process="GPU worker (Model Runner V2)",
        where=Where(
            f"{S}:185 (captured :91, replayed :326); logits_i formed inline in _sample_sequential :160-183",
            f"{S}:250", f"{S}:260", v034=f"{S}:467 (TP batch-sharded sampling :485: confidences off)",
        ),
        removable_when=_WHEN,
    ),
    Patch(
        "confidence-v2-sample-logits",
        SPECULATOR_MODULE,
        "DSparkSpeculator._sample_logits",
        _sample_logits,
        params=("logits", "idx_map", "step"),
        why="log-odds of the max draft probability of each position's logits_i, in the captured step",
        process="GPU worker (Model Runner V2)",
        where=Where(
            f"absent: the fork samples logits_i inline ({S}:160-183); confidence-v2-generate-draft scores it",
            f"{S}:116", f"{S}:116", v034=f"{S}:191 (bias passed apart for the fused Gumbel kernel)",
        ),
        removable_when=_WHEN,
    ),
    Patch(
        "confidence-v2-propose",
        SPECULATOR_MODULE,
        "DSparkSpeculator.propose",
        _propose,
        why="mark the step's InputBatch so the draft-token handler copies that batch's rows",
        process="GPU worker (Model Runner V2)",
        where=Where(f"{S}:206", f"{DF}:343 (inherited)", f"{DF}:435 (inherited)", v034=f"{DF}:459 (inherited)"),
        removable_when=_WHEN,
    ),
    Patch(
        "confidence-v2-set-draft-tokens",
        HANDLER_MODULE,
        "DraftTokensHandler.set_draft_tokens",
        _set_draft_tokens,
        params=("input_batch", "draft_tokens"),
        why="D2H copy of the batch's confidence rows on the handler's copy stream, under its copy event",
        process="GPU worker (Model Runner V2)",
        where=Where(f"{U}:21", f"{U}:59", f"{U}:59", v034=f"{U}:83"),
        removable_when=_WHEN,
    ),
    Patch(
        "confidence-v2-get-draft-tokens",
        HANDLER_MODULE,
        "DraftTokensHandler.get_draft_tokens",
        _get_draft_tokens,
        why="attach the confidences to the DraftTokenIds that take_draft_token_ids returns (sync scheduling)",
        process="GPU worker (Model Runner V2)",
        where=Where(f"{U}:44", f"{U}:82", f"{U}:82", v034=f"{U}:113"),
        removable_when=_WHEN,
    ),
)

"""Draft confidences: captured where a Model Runner V1 drafter samples, carried with the draft
ids to the scheduler, handed to the depth controller.

Capture (worker process, ``SpecDecodeBaseProposer``: draft_model, EAGLE/EAGLE3, MTP, DFlash):
every call that turns draft logits into draft ids records, per row, the log of the draft
distribution's maximum probability at the request's temperature (``log_max_prob``: one float32
log-softmax and one max).  It reads the logits the drafter computed anyway (the greedy path
computes them once, as vLLM does, then takes the argmax); it scores the distribution, never the
drawn token.  The greedy path's logits are only read by vLLM, so they are kept and scored
together at the end of ``propose`` (one pass per proposal); sampled ones are scored at once,
before vLLM scales them in place.  The rows become one ``[requests, drafts]`` tensor, left on
the device.  Every torch call here runs on the drafter's critical path, and on a CPU testbed
each one runs cold after the target's step: the capture keeps to two per proposal.

Transport: ``take_draft_token_ids`` (sync scheduling only: vLLM never calls it under async
scheduling) copies that tensor next to the draft ids it has just copied, turns each value into
``core.confidence``'s feature (``feature_of_log_prob``: the log-odds of the maximum probability,
in Python, a few floats per step) and attaches the rows to the ``DraftTokenIds`` it returns,
which the multiprocess executor pickles as it is; the scheduler's ``update_draft_token_ids``
gives each request's row to the controller.

Nothing happens unless ``additional_config["dspark_dynamic"]`` asks for ``policy: "adaptive"``
with ``adaptive.confidence`` on (the default).  A drafter that overrides the sampling calls
(Gemma4 MTP, Step3.5 MTP), uses a local argmax reduction (no logits) or a heterogeneous
vocabulary reports no confidences; the policy then keeps its acceptance estimates.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from dspark_dynamic.adapter.build import worker_options
from dspark_dynamic.adapter.fail_open import FailOpen
from dspark_dynamic.adapter.patches.scheduler import GUARD as SCHEDULER_GUARD
from dspark_dynamic.adapter.patching import Patch, Where
from dspark_dynamic.core.confidence import FEATURE_CLAMP, feature_of_log_prob

logger = logging.getLogger("vllm.dspark_dynamic")

PROPOSER_MODULE = "vllm.v1.spec_decode.llm_base_proposer"
RUNNER_MODULE = "vllm.v1.worker.gpu_model_runner"
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
ATTR = "_dspark_dynamic_confidence"  # on a proposer: its Capture, or None when off
FIELD = "dspark_dynamic_confidences"  # on a DraftTokenIds: one list of features per request
_GREEDY_EPS = 1e-5  # a temperature at or below this samples greedily (features unscaled)


def confidence_wanted(vllm_config: Any) -> bool:
    """The configured policy gates on draft confidences."""
    options = worker_options(vllm_config)
    return options is not None and options.reads_confidences


def _scaled(logits: Any, temperature: Any) -> Any:
    """``logits / T`` per row (T <= eps: unscaled; parallel drafting: K rows per request,
    request-major, share the request's T); the logits themselves when all are greedy."""
    if temperature is None:
        return logits
    import torch

    t = temperature.float()
    if t.shape[0] != logits.shape[0]:
        t = t.repeat_interleave(logits.shape[0] // t.shape[0])
    return logits.float() / torch.where(t > _GREEDY_EPS, t, torch.ones_like(t)).unsqueeze(1)


def log_max_prob(logits: Any, temperature: Any = None) -> Any:
    """Per row: ``log max softmax(logits / T)`` in float32 (``feature_of_log_prob`` turns it into
    the feature).  Float32 resolves ``1 - q*`` down to ~6e-8, so features above ~16 saturate;
    ``max_prob_log_odds`` is exact there and costs more calls."""
    import torch

    return torch.log_softmax(_scaled(logits, temperature), dim=-1, dtype=torch.float32).max(dim=-1).values


def max_prob_log_odds(logits: Any, temperature: Any = None) -> Any:
    """Per row: ``log(q*/(1-q*))`` of ``softmax(logits / T)`` (T <= eps: unscaled), clamped, as
    one tensor op chain (Model Runner V2 computes it inside the captured draft step).

    Computed as ``max - logsumexp(the other logits)``, so a peaked row keeps its exact log-odds
    (summing probabilities including q* would round ``1 - q*`` to 0 in float32).
    """
    import torch

    x = _scaled(logits, temperature).float()
    top, idx = x.max(dim=-1, keepdim=True)
    others = x.scatter(-1, idx, float("-inf"))
    return (top.squeeze(-1) - torch.logsumexp(others, dim=-1)).clamp(-FEATURE_CLAMP, FEATURE_CLAMP)


class Capture:
    """One proposer's scores (``log_max_prob``): the rows of the ``propose`` call in progress,
    then the last proposal's ``[requests, drafts]`` tensor until the runner takes it.

    A row is either a score vector (scored at once: vLLM scales those logits in place next) or
    logits nobody writes again (the greedy path), kept by reference and scored together at
    ``finish``: one scoring pass per proposal instead of one per draft position."""

    __slots__ = ("temperature", "rows", "last")

    def __init__(self) -> None:
        self.temperature: Any = None
        self.rows: list[tuple[Any, bool]] | None = None  # (tensor, is raw logits)
        self.last: Any = None

    def record(self, logits: Any) -> None:
        """Score logits that vLLM is about to modify in place."""
        if self.rows is not None:
            self.rows.append((log_max_prob(logits, self.temperature), False))

    def keep(self, logits: Any) -> None:
        """Keep logits that stay untouched until ``finish`` (scored there)."""
        if self.rows is not None:
            self.rows.append((logits, True))

    def finish(self, draft_token_ids: Any) -> None:
        """Shape the recorded rows like ``draft_token_ids`` ([requests, drafts]), or drop them."""
        import torch

        rows, self.rows = self.rows, None
        self.last = None
        if not rows or draft_token_ids is None or draft_token_ids.dim() != 2:
            return
        reqs, drafts = draft_token_ids.shape
        if len(rows) == drafts and all(r.shape[0] == reqs for r, _ in rows):  # one call per position
            if all(raw for _, raw in rows) and len({r.shape for r, _ in rows}) == 1:
                stacked = rows[0][0].unsqueeze(1) if drafts == 1 else torch.stack([r for r, _ in rows], dim=1)
                scores = log_max_prob(stacked.reshape(reqs * drafts, -1), self.temperature)
                self.last = scores.reshape(reqs, drafts)
            else:
                scored = [log_max_prob(r, self.temperature) if raw else r for r, raw in rows]
                self.last = torch.stack([f.reshape(reqs) for f in scored], dim=1)
        elif len(rows) == 1 and rows[0][0].shape[0] == reqs * drafts:  # parallel drafting: all at once
            r, raw = rows[0]
            self.last = (log_max_prob(r, self.temperature) if raw else r).reshape(reqs, drafts)


def _attach(proposer: Any) -> None:
    """At construction: a Capture when the configured policy gates on confidences."""
    if confidence_wanted(getattr(proposer, "vllm_config", None)):
        proposer.__dict__[ATTR] = Capture()
        logger.info("dspark_dynamic: capturing draft confidences in %s", type(proposer).__name__)


# Faults in the capture detach it from that drafter only: vLLM drafts as it would alone.
GUARD = FailOpen(ATTR, fallback="this drafter reports no draft confidences (the policy keeps its acceptance estimates)")


def _init(original):
    return GUARD.wrap_init(original, _attach)


def _start(capture: Capture, proposer: Any, *args: Any, **kwargs: Any) -> None:
    capture.rows, capture.last = [], None


def _finish(capture: Capture, proposer: Any, ctx: Any, draft_token_ids: Any, *args: Any, **kwargs: Any) -> None:
    capture.finish(draft_token_ids)


def _propose(original):
    return GUARD.wrap(original, _start, _finish)


def _set_temperature(capture: Capture, proposer: Any, hidden_states: Any, sampling_metadata: Any,
                     *args: Any, **kwargs: Any) -> None:
    capture.temperature = None if getattr(sampling_metadata, "all_greedy", True) else sampling_metadata.temperature


def _sample_draft_tokens(original):
    return GUARD.wrap(original, _set_temperature)


def _record_logits(capture: Capture, proposer: Any, logits: Any, *args: Any, **kwargs: Any) -> None:
    capture.record(logits)  # before vLLM scales the logits in place


def _sample_from_logits(original):
    return GUARD.wrap(original, _record_logits)


def _greedy_sample(original):
    """vLLM's plain greedy branch with its logits kept for the feature (the fork routes MTP layers
    through ``_compute_logits(hidden_states, spec_step_idx)``); any other branch is vLLM's own."""
    where = "SpecDecodeBaseProposer._greedy_sample"

    @functools.wraps(original)
    def _greedy_sample(self, hidden_states: Any, *args: Any, **kwargs: Any):
        capture = self.__dict__.get(ATTR)
        if (capture is None or capture.rows is None or getattr(self, "use_local_argmax_reduction", False)
                or getattr(self, "use_heterogeneous_vocab", False)):
            return original(self, hidden_states, *args, **kwargs)
        compute = getattr(self, "_compute_logits", None)
        logits = compute(hidden_states, *args, **kwargs) if compute is not None else self.model.compute_logits(hidden_states)
        try:
            capture.keep(logits)  # vLLM's greedy path only reads them: scored once, at ``finish``
        except Exception as exc:
            GUARD.trip(self, where, exc)
        return logits.argmax(dim=-1)

    return _greedy_sample


def _take_draft_token_ids(original):
    """Attach the last proposal's rows to the ``DraftTokenIds`` vLLM returns: the draft ids were
    just copied to the host and synchronised, so were the features computed before them."""
    where = "GPUModelRunner.take_draft_token_ids"

    @functools.wraps(original)
    def take_draft_token_ids(self, *args: Any, **kwargs: Any):
        out = original(self, *args, **kwargs)
        drafter = getattr(self, "drafter", None)
        capture = getattr(drafter, "__dict__", {}).get(ATTR)
        if out is None or capture is None or capture.last is None:
            return out
        try:
            last, capture.last = capture.last, None
            n = len(out.req_ids)
            if last.shape[0] >= n:
                setattr(out, FIELD, [[feature_of_log_prob(v) for v in row] for row in last[:n].cpu().tolist()])
        except Exception as exc:
            GUARD.trip(drafter, where, exc)
        return out

    return take_draft_token_ids


def _hand_over(hook: Any, scheduler: Any, ctx: Any, result: Any, draft_token_ids: Any, *args: Any, **kwargs: Any) -> None:
    features = getattr(draft_token_ids, FIELD, None)
    if features is not None:
        controller = hook.controller
        for req_id, row in zip(draft_token_ids.req_ids, features):
            if row is not None:
                controller.set_confidences(req_id, row)


def _update_draft_token_ids(original):
    return SCHEDULER_GUARD.wrap(original, after=_hand_over)


P = "v1/spec_decode/llm_base_proposer.py"
R = "v1/worker/gpu_model_runner.py"
S = "v1/core/sched/scheduler.py"

PATCHES = (
    Patch(
        "confidence-init",
        PROPOSER_MODULE,
        "SpecDecodeBaseProposer.__init__",
        _init,
        params=("vllm_config",),
        why="attach a confidence capture to the drafter when the policy gates on confidences",
        process="worker",
        where=Where(f"{P}:62", f"{P}:73", f"{P}:74", v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {P})"),
        removable_when="same as confidence-propose",
    ),
    Patch(
        "confidence-propose",
        PROPOSER_MODULE,
        "SpecDecodeBaseProposer.propose",
        _propose,
        why="collect one proposal's draft confidences as a [requests, drafts] tensor",
        process="worker",
        where=Where(f"{P}:509", f"{P}:512", f"{P}:511", v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {P})"),
        removable_when="vLLM's V1 drafters report per-draft confidences (0.33 has them on V2 only)",
    ),
    Patch(
        "confidence-sample-draft-tokens",
        PROPOSER_MODULE,
        "SpecDecodeBaseProposer._sample_draft_tokens",
        _sample_draft_tokens,
        params=("hidden_states", "sampling_metadata"),
        why="the requests' temperatures for the confidence feature",
        process="worker",
        where=Where(f"{P}:481", f"{P}:478", f"{P}:477", v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {P})"),
        removable_when="same as confidence-propose",
    ),
    Patch(
        "confidence-greedy-sample",
        PROPOSER_MODULE,
        "SpecDecodeBaseProposer._greedy_sample",
        _greedy_sample,
        params=("hidden_states",),
        why="log-odds of the max draft probability where greedy drafts are taken (logits kept)",
        process="worker",
        where=Where(f"{P}:458 (logits via _compute_logits)", f"{P}:438", f"{P}:437", v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {P})"),
        removable_when="same as confidence-propose",
    ),
    Patch(
        "confidence-sample-from-logits",
        PROPOSER_MODULE,
        "SpecDecodeBaseProposer._sample_from_logits",
        _sample_from_logits,
        params=("logits", "sampling_metadata"),
        why="the same feature where drafts are sampled (probabilistic draft sampling)",
        process="worker",
        where=Where(f"{P}:468", f"{P}:450", f"{P}:449", v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {P})"),
        removable_when="same as confidence-propose",
    ),
    Patch(
        "confidence-take-draft-token-ids",
        RUNNER_MODULE,
        "GPUModelRunner.take_draft_token_ids",
        _take_draft_token_ids,
        why="carry the confidences with the draft ids to the scheduler (sync scheduling)",
        process="worker",
        where=Where(f"{R}:4731", f"{R}:4627", f"{R}:4593", v034=f"absent: vLLM 0.34 has no Model Runner V1 (no {R})"),
        removable_when="same as confidence-propose",
    ),
    Patch(
        "confidence-update-draft-token-ids",
        SCHEDULER_MODULE,
        "Scheduler.update_draft_token_ids",
        _update_draft_token_ids,
        params=("draft_token_ids",),
        why="hand each request's draft confidences to the depth controller",
        process="engine core",
        where=Where(f"{S}:1991", f"{S}:2550", f"{S}:2862", v034=f"{S}:2995"),
        removable_when="same as confidence-propose",
    ),
)

"""The ``dspark_dynamic`` options: parsing and validation (pure logic).

Options live in ``additional_config["dspark_dynamic"]`` (a dict).  The DSpark form
``--speculative-config '{"method": "dspark_dynamic", ...}'`` is rewritten into that dict by the
config adapter.  Every error is a ``DynamicDepthConfigError`` naming the key, the bad value and
what is allowed.  ``to_dict()`` of a parsed object parses back to an equal object.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from dspark_dynamic.core.policy import BatchDepth

CONFIG_KEY = "dspark_dynamic"
ALIAS_METHOD = "dspark_dynamic"
# the peers' rules (core/peers.py), for side-by-side comparisons
PEER_POLICIES = ("vllm-av", "freetoken", "break-even", "p-min")
PEERS_READING_CONFIDENCES = ("vllm-av", "freetoken", "p-min")
POLICIES = ("phase", "adaptive") + PEER_POLICIES
BATCH_DEPTHS = ("auto",) + tuple(m.value for m in BatchDepth)
PHASES = ("reasoning", "answer")
PARALLEL_DRAFTERS = ("dspark", "dflash")  # one pass drafts every position
SEQUENTIAL_DRAFT_TOKEN_COST = 0.2  # a sequential drafter's forward per position, vs a plain step
MARKER_KEYS = ("reasoning_start_ids", "reasoning_end_ids", "reasoning_reset_ids")


class DynamicDepthConfigError(ValueError):
    """A bad ``dspark_dynamic`` option; the message names the key and the allowed values."""


def _fail(key: str, value: Any, allowed: str) -> DynamicDepthConfigError:
    return DynamicDepthConfigError(
        f"dspark_dynamic: invalid option {key!r}={value!r}; allowed: {allowed}"
    )


@dataclass(frozen=True)
class AdaptiveOptions:
    """Knobs of ``policy: "adaptive"`` (see adaptive.py for their meaning)."""

    min_depth: int = 0
    verify_cost_ratio: float = 0.5  # d / T0: cost of one more verified token vs a plain step
    draft_cost_ratio: float = 0.04  # c_draft / T0: cost of running the drafter at all
    # per drafted position: 0 for a parallel drafter (DSpark, DFlash), > 0 for a sequential one;
    # None: from the drafter (the builder sets it: 0 parallel, SEQUENTIAL_DRAFT_TOKEN_COST otherwise)
    draft_token_cost_ratio: float | None = None
    learn_cost: bool = True  # learn the step's costs from measured step times (else the ratios above)
    prior_weight: float = 20.0  # pseudo-observations behind a phase's acceptance prior (1/2 at the first draft)
    window: float = 400.0  # request-steps of memory of a phase's acceptance estimates
    confidence: bool = True  # use the drafter's per-draft confidences when it reports them
    context_features: bool = True  # price each verified draft at its request's context (off: all alike)


@dataclass(frozen=True)
class DynamicDepthOptions:
    num_speculative_tokens: int
    reasoning_depth: int
    answer_depth: int
    policy: str = "phase"
    batch_depth: str = "auto"
    # markers: each an id or a tuple of ids (a multi-token sequence)
    reasoning_start_ids: tuple[int | tuple[int, ...], ...] = ()
    reasoning_end_ids: tuple[int | tuple[int, ...], ...] = ()
    reasoning_reset_ids: tuple[int | tuple[int, ...], ...] = ()
    default_phase: str | None = None  # phase with no marker; None: the parser's, else "answer"
    think_start_token: str | None = None
    think_end_token: str | None = None
    log_interval_s: float = 10.0
    trace_path: str | None = None
    bound_drafts: bool = True  # ask the drafter for no more drafts than the next step verifies
    # a step that drafts nothing for anyone skips the drafter's forward: draft_model's next
    # forward catches its cache up (adapter/patches/drafter_skip.py); DFlash still writes its
    # context (adapter/patches/dflash_context.py)
    skip_idle_drafter: bool = True
    # the live estimate (core/live.py) under the phase policy and the peers' rules; off there, it
    # costs no host time; the adaptive policy always has its own (this option changes nothing there)
    live_estimate: bool = False
    adaptive: AdaptiveOptions = AdaptiveOptions()

    @property
    def reads_confidences(self) -> bool:
        """The policy gates on the drafter's per-draft confidences (the workers capture them)."""
        if self.policy == "adaptive":
            return self.adaptive.confidence
        return self.policy in PEERS_READING_CONFIDENCES

    @property
    def learns_depth(self) -> bool:
        """The policy picks any depth in ``[min_depth, N]`` (not one per phase)."""
        return self.policy == "adaptive" or self.policy in PEER_POLICIES

    @property
    def markers_resolved(self) -> bool:
        """Marker ids alone define the phase (no tokenizer or parser needed)."""
        return bool(self.reasoning_end_ids) and (
            bool(self.reasoning_start_ids) or self.default_phase == "reasoning"
        )

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("num_speculative_tokens")
        for key in MARKER_KEYS:  # none given: null (an empty list is refused)
            out[key] = [m if isinstance(m, int) else list(m) for m in getattr(self, key)] or None
        return out


# Keys a user may set, besides the adaptive sub-dict.
OPTION_KEYS = tuple(
    f.name for f in fields(DynamicDepthOptions) if f.name not in ("num_speculative_tokens",)
)
# Keys that the DSpark form moves out of --speculative-config.
ALIAS_KEYS = OPTION_KEYS + ("base_method",)


def _int(key: str, value: Any, lo: int, hi: int, hint: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _fail(key, value, f"an integer in [{lo}, {hi}]{hint}")
    return value


def _float(key: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _fail(key, value, f"a number in [{lo}, {hi}]")
    if not lo <= value <= hi:
        raise _fail(key, value, f"a number in [{lo}, {hi}]")
    return float(value)


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _ids(key: str, value: Any) -> tuple[int | tuple[int, ...], ...]:
    """Markers: a non-empty list whose items are token ids or non-empty lists of ids (sequences);
    None (the key left out) is no marker given."""
    if value is None:
        return ()
    if _is_id(value):
        value = [value]
    allowed = "a list of markers, each a non-negative token id or a non-empty list of them"
    if not isinstance(value, (list, tuple)):
        raise _fail(key, value, allowed)
    if not value:  # an empty list names no marker: say so rather than fall back silently
        raise _fail(key, value, "at least one marker; leave the key out (or null) to take the markers "
                                "from the reasoning parser or the tokenizer")
    out: list[int | tuple[int, ...]] = []
    for item in value:
        if _is_id(item):
            out.append(item)
        elif isinstance(item, (list, tuple)) and item and all(_is_id(v) for v in item):
            out.append(item[0] if len(item) == 1 else tuple(item))
        else:
            raise _fail(key, value, allowed)
    return tuple(out)


def _token(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise _fail(key, value, "a non-empty string the tokenizer encodes to known tokens")
    return value


def _adaptive(value: Any, num_spec: int) -> AdaptiveOptions:
    if value is None:
        return AdaptiveOptions()
    if not isinstance(value, Mapping):
        raise _fail("adaptive", value, "a dict of adaptive-policy options")
    known = {f.name for f in fields(AdaptiveOptions)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise _fail(f"adaptive.{unknown[0]}", value[unknown[0]], f"one of {sorted(known)}")
    d = AdaptiveOptions()
    learn = value.get("learn_cost", d.learn_cost)
    if not isinstance(learn, bool):
        raise _fail("adaptive.learn_cost", learn, "true or false")
    flags = {}
    for name in ("confidence", "context_features"):
        flags[name] = value.get(name, getattr(d, name))
        if not isinstance(flags[name], bool):
            raise _fail(f"adaptive.{name}", flags[name], "true or false")
    return AdaptiveOptions(
        min_depth=_int("adaptive.min_depth", value.get("min_depth", d.min_depth), 0, num_spec),
        verify_cost_ratio=_float(
            "adaptive.verify_cost_ratio", value.get("verify_cost_ratio", d.verify_cost_ratio), 0.0, 100.0
        ),
        draft_cost_ratio=_float(
            "adaptive.draft_cost_ratio", value.get("draft_cost_ratio", d.draft_cost_ratio), 0.0, 100.0
        ),
        draft_token_cost_ratio=None if value.get("draft_token_cost_ratio") is None else _float(
            "adaptive.draft_token_cost_ratio", value["draft_token_cost_ratio"], 0.0, 100.0,
        ),
        learn_cost=learn,
        prior_weight=_float(
            "adaptive.prior_weight", value.get("prior_weight", d.prior_weight), 0.0, 1e6
        ),
        window=_float("adaptive.window", value.get("window", d.window), 1.0, 1e9),
        **flags,
    )


def parse_options(raw: Any, num_speculative_tokens: int | None) -> DynamicDepthOptions:
    """Validate ``additional_config["dspark_dynamic"]`` against the speculative config."""
    if not isinstance(raw, Mapping):
        raise _fail(CONFIG_KEY, raw, "a dict of options, e.g. {'reasoning_depth': 1}")
    if not num_speculative_tokens:
        raise DynamicDepthConfigError(
            "dspark_dynamic: needs speculative decoding; set --speculative-config with "
            "num_speculative_tokens >= 1 (any method: dspark, draft_model, ngram, eagle, ...)"
        )
    unknown = sorted(set(raw) - set(OPTION_KEYS))
    if unknown:
        raise _fail(unknown[0], raw[unknown[0]], f"one of {sorted(OPTION_KEYS)}")
    n = num_speculative_tokens
    hint = " (0 .. num_speculative_tokens)"
    policy = raw.get("policy", "phase")
    if policy not in POLICIES:
        raise _fail("policy", policy, " | ".join(POLICIES))
    batch_depth = raw.get("batch_depth", "auto")
    if batch_depth not in BATCH_DEPTHS:
        raise _fail("batch_depth", batch_depth, " | ".join(BATCH_DEPTHS))
    trace_path = raw.get("trace_path")
    if trace_path is not None and (not isinstance(trace_path, str) or not trace_path):
        raise _fail("trace_path", trace_path, "a file path (JSONL trace) or null")
    bound_drafts = raw.get("bound_drafts", True)
    if not isinstance(bound_drafts, bool):
        raise _fail("bound_drafts", bound_drafts, "true or false")
    skip_idle_drafter = raw.get("skip_idle_drafter", True)
    if not isinstance(skip_idle_drafter, bool):
        raise _fail("skip_idle_drafter", skip_idle_drafter, "true or false")
    live_estimate = raw.get("live_estimate", False)
    if not isinstance(live_estimate, bool):
        raise _fail("live_estimate", live_estimate, "true or false")
    start_ids = _ids("reasoning_start_ids", raw.get("reasoning_start_ids"))
    end_ids = _ids("reasoning_end_ids", raw.get("reasoning_end_ids"))
    reset_ids = _ids("reasoning_reset_ids", raw.get("reasoning_reset_ids"))
    if set(start_ids) & set(end_ids):
        raise _fail("reasoning_end_ids", raw.get("reasoning_end_ids"), "markers disjoint from reasoning_start_ids")
    default_phase = raw.get("default_phase")
    if default_phase is not None and default_phase not in PHASES:
        raise _fail("default_phase", default_phase, " | ".join(PHASES) + " | null (from the reasoning parser)")
    return DynamicDepthOptions(
        num_speculative_tokens=n,
        reasoning_depth=_int("reasoning_depth", raw.get("reasoning_depth", min(1, n)), 0, n, hint),
        answer_depth=_int("answer_depth", raw.get("answer_depth", n), 0, n, hint),
        policy=policy,
        batch_depth=batch_depth,
        reasoning_start_ids=start_ids,
        reasoning_end_ids=end_ids,
        reasoning_reset_ids=reset_ids,
        default_phase=default_phase,
        think_start_token=_token("think_start_token", raw.get("think_start_token")),
        think_end_token=_token("think_end_token", raw.get("think_end_token")),
        log_interval_s=_float("log_interval_s", raw.get("log_interval_s", 10.0), 0.0, 86400.0),
        trace_path=trace_path,
        bound_drafts=bound_drafts,
        skip_idle_drafter=skip_idle_drafter,
        live_estimate=live_estimate,
        adaptive=_adaptive(raw.get("adaptive"), n),
    )


def split_alias(spec: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a ``method: dspark_dynamic`` speculative config into (vLLM's, ours).

    vLLM's part gets ``method = base_method`` (default ``"dspark"``); ours gets every controller
    key.  The input is not modified.
    """
    vllm_part = {k: v for k, v in spec.items() if k not in ALIAS_KEYS}
    ours = {k: v for k, v in spec.items() if k in OPTION_KEYS}
    base = spec.get("base_method", "dspark")
    if not isinstance(base, str) or not base or base == ALIAS_METHOD:
        raise _fail("base_method", base, "a vLLM speculative method such as 'dspark' (default)")
    vllm_part["method"] = base
    return vllm_part, ours

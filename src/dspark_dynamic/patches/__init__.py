"""Adapters: every vLLM internal the plugin touches, one module per patched behaviour.

| patch (module)                       | target                                   | why                                                        | fork b7f99cdc1                         | vllm(-cpu) 0.32.0                      | vllm 0.33.0                             | removable when                                               |
|--------------------------------------|------------------------------------------|------------------------------------------------------------|----------------------------------------|----------------------------------------|-----------------------------------------|--------------------------------------------------------------|
| engine-args-speculative-config (config_alias) | vllm.engine.arg_utils.EngineArgs.create_speculative_config | method alias dspark_dynamic -> dspark (+ options into additional_config); validate before the engine starts | engine/arg_utils.py:1669 (called :2024) | engine/arg_utils.py:2060 (called :2594) | engine/arg_utils.py:2100 (called :2635) | vLLM accepts per-phase depth options in SpeculativeConfig |
| scheduler-init (scheduler)           | vllm.v1.core.sched.scheduler.Scheduler.__init__ | attach a DepthController when configured              | v1/core/sched/scheduler.py:68          | :85                                    | same class                              | vLLM has a per-request draft-depth hook in the scheduler     |
| scheduler-schedule (scheduler)       | Scheduler.schedule (AsyncScheduler inherits) | trim request.spec_token_ids[:k] before scheduling      | :469 (spec slice :673-688)             | :591 (spec slice :861-876)             | same method (spec slice :1010-1025)     | same                                                         |
| scheduler-update-from-output (scheduler) | Scheduler.update_from_output          | per-phase verified/accepted counts (same numbers as vLLM's) | :1565 (accounting :1643-1668)         | :2026 (accounting :2110-2135)          | :2346-2380                              | vLLM reports spec-decode stats per request phase             |
| scheduler-free-request (scheduler)   | Scheduler._free_request                  | free a finished/aborted request's phase state              | :2142                                  | :2714                                  | same method                             | same as scheduler-schedule                                   |
| cudagraph-decode-lengths (cudagraph) | vllm.v1.worker.gpu.cudagraph_utils.ModelCudaGraphManager._init_candidates (override on the target's subclass of CudaGraphManager._init_candidates) | uniform FULL decode graphs for every verify length 1+k, so shorter steps do not run eagerly | v1/worker/gpu/cudagraph_utils.py:147 (base), class :331; candidates = list indexed by num_tokens, lists shared per bucket | :251 (base), class :579; candidates = dict[(num_tokens, loras)] | cudagraph_utils.py:256-380; with adaptive verification vLLM captures varlen graphs itself and the patch adds nothing | vLLM captures graphs per verify length (its dynamic-SD path does for batch-size schedules only) |

The config adapter forces the cudagraph patch in (strict) only for methods that run on Model
Runner V2 (``dspark``); the worker applies it when ``cudagraph_utils`` is imported.

Rules every adapter follows: it names its target and expected parameters (``patching.Patch``);
it is applied when its module is imported and is a no-op unless ``additional_config`` holds
``dspark_dynamic``; a missing target is an error only when the feature is requested (the
config adapter forces the scheduler patches in with ``strict=True``).
"""

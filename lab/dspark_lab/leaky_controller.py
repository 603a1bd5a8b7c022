"""A depth controller that keeps the state of finished requests (tests only: a leak to catch).

Imported in a process, it makes every ``DepthController`` there drop nothing: ``forget`` (a
request freed) and ``prune`` (the safety net for requests that left without being freed) do
nothing, so ``dspark_dynamic:tracked_requests`` never returns to 0.  ``vllm serve`` imports a
``--reasoning-parser-plugin`` module in its engine core too (the structured-output manager does),
so this loads it where the controller lives::

    vllm serve ... --reasoning-parser-plugin dspark_lab.leaky_controller

It registers no parser; the ``--reasoning-parser`` in use is unchanged.  The soak's leak check
(``dspark_lab.soak.failed_checks``) must fail on such a server.
"""

from __future__ import annotations

from collections.abc import Iterable

from dspark_dynamic.core.controller import DepthController


def _keep(controller: DepthController, request_id: str) -> None:
    """``forget`` that forgets nothing."""


def _keep_all(controller: DepthController, live_request_ids: Iterable[str]) -> None:
    """``prune`` that prunes nothing."""


DepthController.forget = _keep  # type: ignore[method-assign]
DepthController.prune = _keep_all  # type: ignore[method-assign]

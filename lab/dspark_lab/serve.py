"""`vllm serve` on 127.0.0.1 over the tiny models, as a child process group (tests, soak benchmark).

    with TinyServer(target, draft, log_path, extra_args=["--data-parallel-size", "2"]) as server:
        server.url, server.engine_core_pids(), server.scrape()

The real serving layout: engine cores in their own processes (``VLLM_ENABLE_V1_MULTIPROCESSING``
is left on), speculative decoding through the ``dspark_dynamic`` alias over vLLM's
``draft_model``.  On a small CPU box several engine processes need one core each:
``VLLM_CPU_OMP_THREADS_BIND`` (``"0|1"``: data-parallel rank or tensor-parallel rank i on core i)
is set unless the caller's environment has it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from dspark_lab.engine_run import engine_env

DEPTHS = {"reasoning_depth": 1, "answer_depth": 2}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def per_rank_cores(ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` giving each of ``ranks`` local ranks its own core (cycling)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return "|".join(str(cores[i % len(cores)]) for i in range(ranks))


class TinyServer:
    """One ``vllm serve`` process group; ``start()`` waits for ``/health``, ``stop()`` ends it."""

    def __init__(self, target: str, draft: str, log_path: Path, extra_args: list[str] | tuple[str, ...] = (),
                 controller: dict[str, Any] | bool = True, max_num_seqs: int = 4, ranks: int = 2,
                 start_timeout: float = 600.0, speculative_config: dict[str, Any] | None = None,
                 dtype: str = "bfloat16", reasoning_parser: str | None = "deepseek_r1",
                 max_model_len: int = 512) -> None:
        """``speculative_config``: given whole instead of the ``draft``/``controller`` forms (the
        plugin's options then go in ``extra_args``' ``--additional-config``); ``reasoning_parser``
        None: no parser (a model that does not reason)."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.start_timeout = start_timeout
        if speculative_config is not None:
            spec = speculative_config
        elif controller is False:  # plain vLLM draft_model (a baseline; the plugin stays unconfigured)
            spec = {"method": "draft_model", "model": draft, "num_speculative_tokens": 2}
        else:
            spec = {"method": "dspark_dynamic", "base_method": "draft_model", "model": draft,
                    "num_speculative_tokens": 2, **(DEPTHS if controller is True else controller)}
        self.cmd = [str(Path(sys.executable).with_name("vllm")), "serve", target, "--host", "127.0.0.1",
                    "--port", str(self.port), "--max-model-len", str(max_model_len), "--max-num-seqs",
                    str(max_num_seqs), "--enforce-eager", "--dtype", dtype, "--served-model-name", "tiny",
                    *(["--reasoning-parser", reasoning_parser] if reasoning_parser else []),
                    "--speculative-config", json.dumps(spec), *extra_args]
        env = {**os.environ, **engine_env()}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the real serving layout: engine cores in their own processes
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", per_rank_cores(ranks))
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log = None
        self.start_s = 0.0

    def start(self) -> "TinyServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        deadline = t0 + self.start_timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2)
                self.start_s = time.monotonic() - t0
                return self
            except OSError:
                time.sleep(1)
        self.stop()
        raise RuntimeError(f"vllm serve did not start; log tail:\n{self.log_text()[-6000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "TinyServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def engine_core_pids(self) -> dict[str, int]:
        """Process title (``EngineCore`` or ``EngineCore_DP<i>``) -> pid, for this server's engine cores."""
        return processes_titled(self.proc.pid, "VLLM::EngineCore") if self.proc else {}

    def scrape(self) -> dict[tuple[str, tuple], float] | None:
        from dspark_dynamic.tools.bench_client import scrape_metrics

        return scrape_metrics(self.url + "/metrics", 10)


def processes_titled(root_pid: int, prefix: str) -> dict[str, int]:
    """Descendants of ``root_pid`` whose process title (vLLM's ``setproctitle``) starts with ``prefix``."""
    import psutil

    out = {}
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            title = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if title.startswith(prefix):
            out[title.split()[0].removeprefix("VLLM::")] = child.pid
    return out


def rss_bytes(pid: int) -> int:
    import psutil

    return psutil.Process(pid).memory_info().rss

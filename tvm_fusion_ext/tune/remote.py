"""Measuring on another machine through TVM's RPC tracker (``--rpc HOST:PORT --key KEY``).

Candidates are still built here (for CUDA: nvcc on this machine); the runner asks the tracker for a
server registered under ``KEY`` and uploads, loads and times each artifact there. On the GPU box::

    python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190            # anywhere reachable
    python -m tvm.exec.rpc_server --tracker HOST:9190 --key h100          # on the GPU machine
"""

from __future__ import annotations

from typing import Tuple

from ..errors import FusionExtError


def parse_address(text: str) -> Tuple[str, int]:
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise FusionExtError(f"--rpc expects HOST:PORT of a TVM RPC tracker, got '{text}'")
    return host, int(port)


def check_tracker(host: str, port: int, key: str, timeout: float = 10.0) -> None:
    """Fail in one line when the tracker is unreachable or has no free server for ``key``."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        raise FusionExtError(f"cannot reach the RPC tracker at {host}:{port} ({err.strerror or err})") from None
    from tvm import rpc

    try:
        summary = rpc.connect_tracker(host, port).summary()
    except Exception as err:  # noqa: BLE001
        raise FusionExtError(f"{host}:{port} is not a TVM RPC tracker ({str(err).strip().splitlines()[-1]})") \
            from None
    keys = {str(k) for k in summary.get("queue_info", {})}
    if key not in keys:
        raise FusionExtError(f"no RPC server registered under key '{key}' at {host}:{port} "
                             f"(registered: {', '.join(sorted(keys)) or 'none'})")


def make_runner(address: str, key: str, session_timeout: int = 60, workers: int = 1,
                number: int = 3, repeat: int = 1, check: bool = True):
    """A MetaSchedule ``RPCRunner`` measuring on the servers registered at tracker ``address`` under ``key``."""
    from tvm.s_tir import meta_schedule as ms

    if not key:
        raise FusionExtError("--rpc needs --key KEY (the key the RPC server registered with)")
    host, port = parse_address(address)
    if check:
        check_tracker(host, port, key)
    rpc = ms.runner.RPCRunner(
        rpc_config=ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=key,
                                       session_timeout_sec=session_timeout),
        evaluator_config=ms.runner.EvaluatorConfig(number=number, repeat=repeat, min_repeat_ms=0,
                                                   enable_cpu_cache_flush=False),
        max_workers=workers)
    return _guarded_runner_class()(rpc, host, port, key)


def free_servers(host: str, port: int, key: str, timeout: float = 5.0) -> int:
    """How many servers are registered under ``key`` and free now (-1 if the tracker cannot be asked)."""
    from tvm import rpc

    try:
        info = rpc.connect_tracker(host, port).summary().get("queue_info", {})
    except Exception:  # noqa: BLE001
        return -1
    entry = info.get(key) if isinstance(info, dict) else None
    return int(entry.get("free", 0)) if entry else 0


_GUARDED: dict = {}


def _guarded_runner_class():
    """An RPCRunner that notices when the device server went away.

    Without it, every candidate after the server died waits for a server that never comes back until its
    session timeout (``session_timeout`` seconds *per candidate*), so a run looks hung for many minutes.
    Before each batch the tracker is asked for a free server under the key (waiting up to ``wait`` s: the
    server re-registers a moment after each session); if none comes, the batch and all later ones fail at
    once with one clear error message that the progress line and the manifest report."""
    if "cls" in _GUARDED:
        return _GUARDED["cls"]
    import time

    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerResult

    @derived_object
    class _Failed(PyRunnerFuture):
        def __init__(self, msg):
            super().__init__()
            self.msg = msg

        def done(self):
            return True

        def result(self):
            return RunnerResult(run_secs=None, error_msg=self.msg)

    @derived_object
    class GuardedRPCRunner(PyRunner):
        def __init__(self, inner, host, port, key, wait: float = 15.0):
            super().__init__()
            self.inner, self.host, self.port, self.key, self.wait = inner, host, port, key, wait
            self.gone = False

        def _available(self) -> bool:
            deadline = time.time() + self.wait
            while True:
                if free_servers(self.host, self.port, self.key) > 0:
                    return True
                if time.time() > deadline:
                    return False
                time.sleep(0.5)

        def run(self, runner_inputs):
            if not self.gone and not self._available():
                self.gone = True
                print(f"tune: RPC server for key '{self.key}' at {self.host}:{self.port} went away; the remaining "
                      f"candidates are not measured (restart the server and rerun to resume)", flush=True)
            if self.gone:
                msg = f"RPC server for key '{self.key}' at {self.host}:{self.port} went away; not measured"
                return [_Failed(msg) for _ in runner_inputs]
            return self.inner.run(runner_inputs)

    _GUARDED["cls"] = GuardedRPCRunner
    return GuardedRPCRunner

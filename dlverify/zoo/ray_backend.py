"""`dlverify zoo --ray auto|ADDRESS`: the zoo's items as Ray tasks instead of
the local pool's children. Ray is an optional extra (`pip install 'dlverify[ray]'`).

Each item is one Ray task that asks for one CPU (and, under a memory limit,
that much of Ray's `memory` resource, so that Ray places it where it fits).
The task itself runs the item exactly as the local pool does: in a child of
dlverify.supervise under the item's time and memory limits, on the Ray
worker. So the verdicts, the limits and the way a hung, crashing or greedy
item is reported are the local pool's; the task returns the supervisor's
TaskOutcome, and the runner (dlverify/zoo/runner.py) handles it as its own:
cache, journal and reports are the same. The driver (the `dlverify zoo`
process) only waits; a task that dies with its Ray worker (Ray's memory
monitor, a lost node) comes back as a crash or out-of-memory result, never
as an exception in the driver. Tasks are never retried: an item that
crashed a worker would crash the next one.

`auto` is ray.init()'s own choice: the running cluster if there is one (the
RAY_ADDRESS variable, or a cluster started on this machine), else a local one
started for this run and stopped at its end. Any other value is a cluster's
address (`host:port`, `ray://host:port`). The workers must be able to import
dlverify (installed in their environment) and read the item files at the
paths the driver names (the driver's working directory is entered on the
worker when it exists there: one machine or a shared file system).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from dlverify.errors import InputError
from dlverify.supervise import Limits, TaskOutcome, run_supervised

EXTRA_HINT = "pip install 'dlverify[ray]'"
# Environment variables a worker must see as the driver does before its fork
# server imports JAX (the CLI's host devices, ensure_host_devices).
FORWARDED_ENV = ("XLA_FLAGS", "JAX_PLATFORMS")


def import_ray() -> Any:
    """The ray module; InputError (one line, exit 2) naming the extra when missing."""
    try:
        import ray
    except ImportError as e:
        raise InputError(f"--ray needs Ray, an optional extra: {EXTRA_HINT} "
                         f"({type(e).__name__}: {e})") from None
    return ray


@dataclass(frozen=True)
class WorkerSetup:
    """What a task applies on its worker before the item runs: the driver's
    working directory (relative item paths) and the forwarded environment."""

    cwd: str
    env: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def of_driver() -> "WorkerSetup":
        return WorkerSetup(os.getcwd(), {k: os.environ[k] for k in FORWARDED_ENV
                                         if k in os.environ})

    def apply(self) -> None:
        if os.path.isdir(self.cwd):
            os.chdir(self.cwd)
        os.environ.update(self.env)


def item_task(task: Callable[..., Any], args: tuple, limits: Limits,
              setup: WorkerSetup) -> TaskOutcome:
    """The body of a Ray task: one zoo item under the supervisor, on the worker."""
    from dlverify.zoo.tasks import ready_task

    setup.apply()
    if not _fork_server_running():
        # As the local pool does once per run: the worker's fork server imports
        # JAX (seconds) here, not within the first item's limits.
        run_supervised(ready_task, ())
    return run_supervised(task, args, limits)


def _fork_server_running() -> bool:
    """This worker process started dlverify.supervise's fork server already
    (a Ray worker runs many tasks; the server lives as long as the worker)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # no public handle, as dlverify.supervise.shutdown
    return getattr(server, "_forkserver_pid", None) is not None


def lost_outcome(ray: Any, e: Exception, seconds: float) -> TaskOutcome:
    """A task that ended without the supervisor's outcome: its worker or node
    died, or Ray failed it. A result of the item, never an exception."""
    x = ray.exceptions
    text = " ".join(str(e).split())[:300]
    if isinstance(e, x.OutOfMemoryError):
        return TaskOutcome("out_of_memory", seconds=seconds, phase="ray",
                           message=f"out of memory: Ray's memory monitor killed the worker "
                                   f"verifying it ({text})")
    if isinstance(e, (x.WorkerCrashedError, x.NodeDiedError, x.LocalRayletDiedError)):
        return TaskOutcome("crashed", seconds=seconds, phase="ray",
                           message=f"the Ray worker verifying it died without a result "
                                   f"({type(e).__name__})")
    return TaskOutcome("internal_error", seconds=seconds, phase="ray",
                       message=f"internal error in ray: {type(e).__name__}: {text}")


def _check_reachable(address: str) -> None:
    """Nothing listening at the address's host:port is an InputError at once:
    ray.init would retry for minutes, printing a warning every few seconds."""
    import socket

    host, _, port = address.split("://", 1)[-1].rpartition(":")
    if not host or not port.isdigit():
        return  # not host:port: Ray's own parsing says what is wrong
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as e:
        raise InputError(f"--ray {address}: no Ray cluster answers at {host}:{port} "
                         f"({e.strerror or type(e).__name__})") from None


class RayPool:
    """The driver's side: submits items, waits for their outcomes (from the
    runner's threads, one item each), cancels what still runs at the end."""

    def __init__(self, ray: Any, started_here: bool) -> None:
        self.ray = ray
        self.started_here = started_here  # ray.init was called by this run: shut down after
        self.setup = WorkerSetup.of_driver()
        self.remote = ray.remote(item_task)
        self.lock = threading.Lock()
        self.running: set[Any] = set()
        self.node_memory = max((n.get("Resources", {}).get("memory", 0.0)
                                for n in ray.nodes() if n.get("Alive")), default=0.0)

    @staticmethod
    def connect(address: str) -> "RayPool":
        """Join the cluster `address` names ("auto": ray.init()'s own choice).
        A driver that already joined one (a test, a notebook) keeps it."""
        import logging

        ray = import_ray()
        if address != "auto":
            _check_reachable(address)
        if ray.is_initialized():
            return RayPool(ray, started_here=False)
        try:
            ray.init(address=None if address == "auto" else address, include_dashboard=False,
                     logging_level=logging.WARNING, log_to_driver=True)
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
            text = " ".join(str(e).split())[:300]
            raise InputError(f"--ray {address}: cannot join the Ray cluster: "
                             f"{type(e).__name__}: {text}") from None
        return RayPool(ray, started_here=True)

    def run(self, task: Callable[..., Any], args: tuple, limits: Limits = Limits(),
            deadline: float | None = None, on_event: Callable[[Any], None] | None = None
            ) -> TaskOutcome:
        """run_supervised's signature and promise (never raises for what the
        item does), on the cluster. Progress events do not cross Ray: the
        display shows an item as running until it ends."""
        t0 = time.monotonic()
        memory = limits.memory_bytes
        if memory and memory > self.node_memory:
            return TaskOutcome("input_error", seconds=0.0, message=(
                f"no node of the Ray cluster has {memory / (1 << 30):g}G of memory for this "
                f"item's limit (the largest has {self.node_memory / (1 << 30):.1f}G)"))
        resources: dict[str, Any] = {"num_cpus": 1, "max_retries": 0}
        if memory:
            resources["memory"] = memory
        ref = self.remote.options(**resources).remote(task, args, limits, self.setup)
        with self.lock:
            self.running.add(ref)
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayError as e:
            return lost_outcome(self.ray, e, time.monotonic() - t0)
        finally:
            with self.lock:
                self.running.discard(ref)

    def close(self) -> None:
        """Cancel the tasks still running (an interrupted run), then leave the
        cluster; a cluster started for this run stops with it."""
        with self.lock:
            left = list(self.running)
        for ref in left:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001: already finished or the cluster is gone
                pass
        if self.started_here:
            self.ray.shutdown()

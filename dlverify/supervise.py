"""Run one unit of work (a case, an HLO pair, a zoo item) in a child process
under a wall-clock and a memory limit, and get back a picklable value.

Why a child process: a SIGALRM in the verifying process is swallowed by broad
exception handlers, or fires inside JAX's C++ callbacks, so the same command
could end in any exit code. Here the parent does nothing but wait: at the
deadline it kills the child's whole process group (engines started as
subprocesses go with it), whatever phase the child is in.

- Start method: a fork server (multiprocessing "forkserver") that imported JAX
  once (importing JAX starts no backend, so forking after it is safe, unlike
  forking a process whose JAX backend runs threads). Each task is a fresh fork:
  no state leaks from one case to the next, and the import is paid once per run.
- Memory: RLIMIT_DATA in the child (it bounds the heap and anonymous mappings,
  not the address space JAX reserves for thread stacks and code). Python raises
  MemoryError; C++ code aborts. A child that dies abnormally under a memory
  limit is reported as out of memory (the likeliest cause), without a limit as
  a crash.
- The child tells its parent the phase it is in ("import", "trace", "engine",
  "report", ...) and its progress, so a limit names the phase it hit.

The in-process path (`dlverify.verify_jax`) does not use this module. As with
any multiprocessing start method but fork, a script that calls
`run_supervised` needs the `if __name__ == "__main__":` guard: each child
imports the main module.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Literal

from dlverify.errors import InputError
from dlverify.limits import OutOfTime

Status = Literal["ok", "input_error", "out_of_time", "out_of_memory", "internal_error", "crashed"]

# Modules the fork server imports once, so that each child starts warm. None
# of them starts a JAX backend (forking after that would not be safe).
PRELOAD = ["numpy", "jax", "jax.numpy", "clingo", "dlverify.api", "dlverify.cases",
           "dlverify.tasks", "dlverify.frontends.jaxpr", "dlverify.frontends.jax_compiled",
           "dlverify.hlo_api", "dlverify.artifacts", "dlverify.reports.text",
           "dlverify.reports.json_report"]
_PR_SET_PDEATHSIG = 1
_OUTPUT_TAIL = 64 * 1024  # bytes of a task's own output forwarded at most
_PROGRESS_INTERVAL = 0.1  # seconds between two progress messages of a child


@dataclass(frozen=True)
class Limits:
    """What one task may use. None: no limit."""

    seconds: float | None = None
    memory_bytes: int | None = None


@dataclass
class TaskOutcome:
    """How a supervised task ended. `value` is the task's return value when
    status is "ok"; otherwise `message` says what happened (one line)."""

    status: Status
    value: Any = None
    message: str = ""
    file: str = ""
    line: int = 0
    phase: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def hit_limit(self) -> bool:
        return self.status in ("out_of_time", "out_of_memory")

    def input_error(self) -> InputError:
        """The outcome of a failed task as the InputError the CLI prints."""
        return InputError(self.message, self.file, self.line)


@dataclass
class Event:
    """A message from a running child: its phase, or progress within it."""

    kind: Literal["phase", "progress"]
    phase: str = ""
    done: int = 0
    total: int = 0


class Reporter:
    """Handed to a task: tells the parent which phase it is in and how far it got.
    Without a connection (the in-process path) it does nothing."""

    def __init__(self, conn: Connection | None = None) -> None:
        self._conn = conn
        self._last = 0.0
        self.current = "startup"

    def phase(self, name: str) -> None:
        self.current = name
        self._send(Event("phase", name))

    def progress(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < _PROGRESS_INTERVAL:
            return
        self._last = now
        self._send(Event("progress", self.current, done, total))

    def _send(self, event: Event) -> None:
        if self._conn is not None:
            try:
                self._conn.send(("event", event))
            except (OSError, ValueError):
                pass  # the parent is gone: it kills us soon anyway


NULL_REPORTER = Reporter(None)


def parse_memory(text: str) -> int:
    """"4G", "512M", "1.5GiB", "100000" (bytes) -> bytes; InputError otherwise."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in units and t[-1:] != "" else ""
    number = t[: len(t) - len(unit)]
    try:
        value = float(number)
    except ValueError:
        raise InputError(f"--max-memory {text!r}: expected a size such as 4G, 512M or "
                         "1000000 (bytes)") from None
    size = value * units[unit]
    if not (size == size) or size < (64 << 20) or size > (1 << 50):
        raise InputError(f"--max-memory {text!r}: the size must be between 64M and 1024T")
    return int(size)


def check_seconds(value: float | None, option: str = "--timeout") -> float | None:
    """A positive, finite number of seconds, at most 1e7 (116 days)."""
    if value is None:
        return None
    if not (0 < value <= 1e7):  # also false for nan
        raise InputError(f"{option} {value!r}: expected seconds, a number > 0 and at most 1e7")
    return value


# ---------------------------------------------------------------------------
# the parent side

def _context() -> multiprocessing.context.BaseContext:
    # The fork server starts as `python -c ...`, which puts the working directory
    # first on its sys.path (Python 3.11's fork server ignores the parent's): run
    # from a source checkout after `pip install .`, the checkout's dlverify/ (which
    # lacks the installed dlverify.frontends) would shadow the installed package.
    # PYTHONSAFEPATH keeps the working directory off, as the `dlverify` command has it.
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run_supervised(task: Callable[..., Any], args: tuple, limits: Limits = Limits(),
                   deadline: float | None = None,
                   on_event: Callable[[Event], None] | None = None) -> TaskOutcome:
    """Run `task(*args, reporter=Reporter)` in a child process. `task` and
    `args` must be picklable (a module-level function); so must its value.
    `deadline` (time.monotonic()) ends the task earlier than `limits.seconds`
    when the whole run has a limit. Never raises for anything the task does;
    KeyboardInterrupt in the parent kills the child and is re-raised."""
    t0 = time.monotonic()
    ends = [d for d in (deadline, t0 + limits.seconds if limits.seconds else None) if d]
    end = min(ends) if ends else None
    ctx = _context()
    recv, send = ctx.Pipe(duplex=False)
    # The child's scratch folder: its output log, and the temporary files of
    # whatever it runs (Soufflé's fact folders). Removed here, by the parent,
    # because a child killed at its deadline runs no cleanup of its own.
    scratch = tempfile.mkdtemp(prefix="dlverify-task-")
    log = os.path.join(scratch, "output.log")
    open(log, "wb").close()
    proc = ctx.Process(target=_child_main, args=(send, task, args, limits.memory_bytes, log),
                       daemon=True, name="dlverify-task")
    try:
        outcome = _supervise(proc, recv, send, limits, deadline, end, t0, on_event)
        _forward_output(log, outcome)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return outcome


def _forward_output(log: str, outcome: TaskOutcome) -> None:
    """What the task printed (the user's prints, JAX's warnings) goes to our
    stderr; not after a crash: that is a C++ stack dump, the message says it all."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - _OUTPUT_TAIL))
            text = f.read().decode("utf-8", errors="replace")
        os.unlink(log)
    except OSError:
        return
    crashed = outcome.status in ("crashed", "out_of_memory", "out_of_time")
    if text and (not crashed or os.environ.get("DLVERIFY_DEBUG")):
        if size > _OUTPUT_TAIL:
            text = f"[... {size - _OUTPUT_TAIL} bytes of the task's output left out]\n" + text
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


def _supervise(proc, recv: Connection, send: Connection, limits: Limits, deadline: float | None,
               end: float | None, t0: float,
               on_event: Callable[[Event], None] | None) -> TaskOutcome:
    phase = "startup"
    started, cancelled = threading.Event(), threading.Event()
    start_errors: list[BaseException] = []

    def start() -> None:
        # Process.start() blocks while the fork server imports JAX (the first
        # time): a thread, so that the deadline holds during that wait too.
        try:
            proc.start()
        except BaseException as e:  # noqa: BLE001: reported below
            start_errors.append(e)
        finally:
            send.close()
            started.set()
            if cancelled.is_set():
                _kill(proc)

    threading.Thread(target=start, daemon=True, name="dlverify-start").start()
    try:
        while not started.wait(0.5 if end is None else max(0.0, min(end - time.monotonic(), 0.5))):
            if end is not None and time.monotonic() >= end:
                cancelled.set()
                if started.is_set():
                    _kill(proc)
                return TaskOutcome("out_of_time", phase=phase, seconds=time.monotonic() - t0,
                                   message=_time_message(limits, deadline, phase))
        if proc.pid is None:
            why = (f"{type(start_errors[0]).__name__}: {_one_line(start_errors[0])}"
                   if start_errors else "unknown cause")
            return TaskOutcome("internal_error", phase=phase, seconds=time.monotonic() - t0,
                               message=f"internal error in startup: the child process could "
                                       f"not be started: {why}")
        while True:
            remaining = None if end is None else end - time.monotonic()
            if remaining is not None and remaining <= 0:
                _kill(proc)
                return TaskOutcome("out_of_time", phase=phase, seconds=time.monotonic() - t0,
                                   message=_time_message(limits, deadline, phase))
            ready = wait([recv, proc.sentinel], timeout=0.5 if remaining is None
                         else min(remaining, 0.5))
            if recv in ready:
                try:
                    kind, payload = recv.recv()
                except (EOFError, OSError):
                    kind, payload = "eof", None
                except Exception as e:  # noqa: BLE001: a value that does not unpickle here
                    _kill(proc)
                    return TaskOutcome("internal_error", phase=phase, seconds=time.monotonic() - t0,
                                       message=f"internal error in report: reading the result "
                                               f"failed: {type(e).__name__}: {_one_line(e)}")
                if kind == "event":
                    if payload.kind == "phase":
                        phase = payload.phase
                    if on_event is not None:
                        on_event(payload)
                    continue
                if kind == "done":
                    proc.join(5)
                    if proc.exitcode is None:
                        _kill(proc)
                    payload.seconds = time.monotonic() - t0
                    if payload.status == "out_of_memory":
                        payload.message = _memory_message(limits, payload.phase or phase)
                    return payload
                # the pipe closed without a result: the child died, see below
            if proc.sentinel in ready or not proc.is_alive() or recv in ready:
                proc.join(1)
                return _died(proc, limits, phase, time.monotonic() - t0)
    except KeyboardInterrupt:
        cancelled.set()
        if started.is_set():
            _kill(proc)
        raise
    finally:
        recv.close()
        if started.is_set() and proc.pid is not None and proc.exitcode is None:
            _kill(proc)


def shutdown() -> None:
    """Stop the fork server at the end of a command. It holds the command's
    stdout and stderr open, and while it is still importing JAX it would only
    notice the end of its parent after the import: whoever reads the command's
    output would wait for it. Its children die with it (PR_SET_PDEATHSIG)."""
    from multiprocessing import forkserver

    server = forkserver._forkserver  # the module's one fork server: no public handle
    pid = getattr(server, "_forkserver_pid", None)
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError, PermissionError):
            pass
        server._forkserver_pid = None
        server._forkserver_address = None
        server._forkserver_alive_fd = None


def _time_message(limits: Limits, deadline: float | None, phase: str) -> str:
    limit = f"{limits.seconds:g} s" if limits.seconds else "the run's time limit"
    return f"out of time after {limit} (while in phase {phase})"


def _memory_message(limits: Limits, phase: str) -> str:
    if not limits.memory_bytes:
        return f"out of memory (while in phase {phase})"
    return (f"out of memory: over the limit of {_size(limits.memory_bytes or 0)} "
            f"(while in phase {phase})")


def _size(n: int) -> str:
    for unit, k in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= k:
            return f"{n / k:g}{unit}"
    return f"{n} bytes"


def _died(proc, limits: Limits, phase: str, seconds: float) -> TaskOutcome:
    code = proc.exitcode
    how = (f"was killed by {signal.Signals(-code).name}" if code is not None and code < 0
           and -code in signal.Signals._value2member_map_ else f"exited with code {code}")
    if limits.memory_bytes:  # allocation failures in C++ end a process in many ways
        return TaskOutcome("out_of_memory", phase=phase, seconds=seconds,
                           message=_memory_message(limits, phase).replace(
                               "out of memory:", "out of memory (most likely):")
                           + f"; the process {how} without a result")
    return TaskOutcome("crashed", phase=phase, seconds=seconds,
                       message=f"the process verifying it {how} without a result "
                               f"(while in phase {phase})")


def _kill(proc) -> None:
    """Kill the child and everything it started (its own process group)."""
    if proc.pid is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except (ProcessLookupError, OSError, ValueError):
        pass
    proc.join(5)


# ---------------------------------------------------------------------------
# the child side

def _child_main(conn: Connection, task: Callable[..., Any], args: tuple,
                memory_bytes: int | None, log: str) -> None:
    try:
        _child_run(conn, task, args, memory_bytes, log)
    finally:  # whatever the task did to the interpreter: no atexit, no JAX teardown
        os._exit(0)


def _child_run(conn: Connection, task: Callable[..., Any], args: tuple,
               memory_bytes: int | None, log: str) -> None:
    _isolate(log)
    # Temporary files go to the scratch folder the parent removes (see run_supervised).
    tempfile.tempdir = os.path.dirname(log)
    os.environ["TMPDIR"] = tempfile.tempdir
    if memory_bytes:
        import resource
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    reporter = Reporter(conn)
    try:
        conn.send(("event", Event("phase", "startup")))
    except OSError:
        return  # the parent gave up on us before we started
    try:
        outcome = TaskOutcome("ok", value=task(*args, reporter=reporter), phase=reporter.current)
    except InputError as e:
        outcome = TaskOutcome("input_error", message=e.message, file=e.file, line=e.line,
                              phase=reporter.current)
    except MemoryError:
        outcome = TaskOutcome("out_of_memory", phase=reporter.current)
    except OutOfTime as e:
        outcome = TaskOutcome("out_of_time", phase=reporter.current, message=str(e))
    except BaseException as e:  # noqa: BLE001: reported, never a traceback
        outcome = _classify(e, reporter.current)
    try:
        conn.send(("done", outcome))
    except MemoryError:
        _send_last(conn, TaskOutcome("out_of_memory", phase="report"))
    except Exception as e:  # noqa: BLE001: the value did not pickle
        _send_last(conn, TaskOutcome("internal_error", phase="report",
                                     message=f"internal error in report: {type(e).__name__}: "
                                             f"{_one_line(e)}"))
    conn.close()


def _send_last(conn: Connection, outcome: TaskOutcome) -> None:
    try:
        conn.send(("done", outcome))
    except Exception:  # noqa: BLE001: the parent reports the child's death
        pass


def is_out_of_memory(e: BaseException) -> bool:
    """MemoryError, or a C++ allocation failure that JAX, XLA or clingo turned
    into another exception (RuntimeError: ... std::bad_alloc)."""
    if isinstance(e, MemoryError):
        return True
    text = _one_line(e)
    return "bad_alloc" in text or "RESOURCE_EXHAUSTED" in text or "Out of memory" in text


def _classify(e: BaseException, phase: str) -> TaskOutcome:
    text = _one_line(e)
    if is_out_of_memory(e):
        return TaskOutcome("out_of_memory", phase=phase)
    if os.environ.get("DLVERIFY_DEBUG"):
        traceback.print_exception(e, file=sys.stderr)
    return TaskOutcome("internal_error", phase=phase,
                       message=f"internal error in {phase}: {type(e).__name__}: {text}")


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return text[:500] + ("..." if len(text) > 500 else "")


def _isolate(log: str) -> None:
    """Own process group (the parent kills it whole); die with the fork server;
    what the task prints goes to a file the parent forwards to its stderr, so
    stdout stays the report's."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    except OSError:
        pass

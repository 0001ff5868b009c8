"""Evaluate a program with Soufflé as a subprocess (when `souffle` is on PATH).

Facts are written as `<dir>/<Name>.facts` (headerless TSV); the program runs as
a compiled binary (`souffle -o`, built once per rule text and cached in the
user's cache directory) when one is cached or a C++ compiler can build it, and
in Soufflé's interpreter otherwise; processes that need the same rules at once
(test workers, a zoo's pool) build them once, the others waiting on a lock file; each output `<out dir>/<Name>.csv` is read
back by the relation's declared column types.

Every subprocess is killed when the run ends early (a time limit, an
interrupt), and a failure is an EngineError naming Soufflé's message and the
.dl file and line it points at.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Mapping, Sequence

from dlverify.engine.facts_io import read_csv, write_facts_dir
from dlverify.engine.syntax import Program
from dlverify.errors import EngineError
from dlverify.limits import OutOfTime

SouffleMode = Literal["auto", "compiled", "interpreted"]
MODE_ENV = "DLVERIFY_SOUFFLE_MODE"   # auto | compiled | interpreted
THREADS_ENV = "DLVERIFY_SOUFFLE_THREADS"  # -j for Soufflé (default 1)
COMPILERS = ("c++", "g++", "clang++")
# Soufflé's diagnostics: "Error: <what> in file <name> at line <n>"
_LOCATION = re.compile(r"in file (\S+) at line (\d+)")


def type_resolver(program: Program):
    def resolve(ty: str) -> tuple[str, tuple[str, ...]]:
        kind = program.kind(ty)
        fields = tuple(t for _, t in program.types[ty].fields) if kind == "record" else ()
        return kind, fields
    return resolve


def souffle_command(main_dl: Path, facts_dir: Path, out_dir: Path, souffle: str = "souffle",
                    threads: int = 1) -> list[str]:
    """The interpreter's command line."""
    return [souffle, "-w", "-j", str(threads), "-F", str(facts_dir), "-D", str(out_dir),
            "-I", str(main_dl.parent), str(main_dl)]


def default_threads() -> int:
    """$DLVERIFY_SOUFFLE_THREADS, else 1: the runs are small (one segment each) and a second
    thread made a compiled 32-layer run slower on 2 busy cores (bench/bench_verify.py)."""
    value = os.environ.get(THREADS_ENV, "")
    if not value:
        return 1
    if not value.isdigit() or int(value) < 1:
        raise EngineError(f"{THREADS_ENV}={value!r}: expected a positive number of threads")
    return int(value)


def _environment() -> dict[str, str]:
    """OpenMP threads that sleep when idle: spinning ones made a 0.04 s run take 11 s when the
    cores were busy with other work."""
    env = dict(os.environ)
    env.setdefault("OMP_WAIT_POLICY", "passive")
    return env


def cache_root() -> Path:
    """$XDG_CACHE_HOME/dlverify/souffle, or ~/.cache/dlverify/souffle."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dlverify" / "souffle"


@functools.lru_cache(maxsize=4)
def souffle_version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineError(f"`{exe} --version` failed: {e}") from None
    return out.stdout.strip()


def program_digest(program: Program, exe: str) -> str:
    """Content hash of the rule files (in include order) and the Soufflé version."""
    h = hashlib.sha256(souffle_version(exe).encode())
    for path in program.files:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:24]


def cached_binary(program: Program, exe: str) -> Path | None:
    """The compiled binary of these rules, when one is already in the cache."""
    path = cache_root() / f"rules-{program_digest(program, exe)}"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def compiler_available() -> bool:
    return any(shutil.which(c) for c in COMPILERS)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _run(cmd: list[str], timeout: float | None, what: str, program: Program) -> None:
    """Run cmd; kill it on any early exit; EngineError on failure, OutOfTime past `timeout`."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_environment())
    except OSError as e:
        raise EngineError(f"{what}: `{cmd[0]}` could not start: {e}") from None
    try:
        _out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise OutOfTime(f"out of time after {timeout:g} s ({what})") from None
    finally:
        _kill(proc)  # a time limit (SIGALRM -> OutOfTime) or an interrupt lands here too
    if proc.returncode != 0:
        raise _engine_error(what, proc.returncode, err, program)


def _engine_error(what: str, code: int, stderr: str, program: Program) -> EngineError:
    lines = [x for x in stderr.strip().splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("Error")] or lines[-3:] or ["(no message)"]
    file, line = "", 0
    m = _LOCATION.search(errors[0])
    if m:
        named = Path(m.group(1)).name
        file = next((str(p) for p in program.files if p.name == named), m.group(1))
        line = int(m.group(2))
    msg = f"Soufflé {what} failed (exit code {code}): " + " | ".join(errors[:3])
    return EngineError(msg, file, line)


@contextlib.contextmanager
def _build_lock(path: Path, timeout: float | None) -> Iterator[None]:
    """Hold an exclusive lock on `path` (another process building the same rules holds
    it until its binary is in place); OutOfTime when not acquired within `timeout`."""
    with open(path, "a+") as f:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (fcntl.LOCK_NB if deadline is not None else 0))
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise OutOfTime(f"out of time after {timeout:g} s (waiting for another "
                                    f"process's compilation of the rules)") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def compile_binary(program: Program, main_dl: Path, exe: str, timeout: float | None = None) -> Path:
    """Build (once) and cache the compiled binary of these rules; returns its path. A
    process that finds another one building them waits for that build."""
    found = cached_binary(program, exe)
    if found is not None:
        return found
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"rules-{program_digest(program, exe)}"
    start = time.monotonic()
    with _build_lock(target.with_suffix(".lock"), timeout):
        found = cached_binary(program, exe)
        if found is not None:   # built while this process waited
            return found
        if timeout is not None:
            timeout = max(0.001, timeout - (time.monotonic() - start))
        build = Path(tempfile.mkdtemp(prefix="build-", dir=root))
        try:
            binary = build / "rules"
            _run([exe, "-w", "-o", str(binary), "-I", str(main_dl.parent), str(main_dl)], timeout,
                 "compilation", program)
            os.replace(binary, target)  # atomic: a reader sees no binary or the whole one
        finally:
            shutil.rmtree(build, ignore_errors=True)
    return target


def prebuild(main_dl: Path) -> Path | None:
    """Compile the rules of `main_dl` into the cache now (None when `souffle` or a C++
    compiler is missing, or the build fails: runs then interpret or build themselves),
    so that later runs find the binary: the test suite starts this beside its workers."""
    from dlverify.engine import load_rules   # (the package imports this module)

    exe = shutil.which("souffle")
    if exe is None or not compiler_available():
        return None
    try:
        return compile_binary(load_rules(main_dl).program, main_dl, exe)
    except EngineError:
        return None


def requested_mode() -> SouffleMode:
    """The mode asked for in the environment (auto when unset)."""
    mode = os.environ.get(MODE_ENV, "") or "auto"
    if mode not in ("auto", "compiled", "interpreted"):
        raise EngineError(f"{MODE_ENV}={mode!r}: expected auto, compiled or interpreted")
    return mode  # type: ignore[return-value]


@dataclass(frozen=True)
class SoufflePlan:
    """How this run evaluates: the executable, compiled or interpreted, threads."""
    exe: str
    mode: Literal["compiled", "interpreted"]
    binary: Path | None
    threads: int


def plan_run(program: Program, main_dl: Path, mode: SouffleMode | None = None,
             threads: int | None = None, timeout: float | None = None) -> SoufflePlan:
    """auto: a cached binary, else compile when a C++ compiler is present, else interpret."""
    exe = shutil.which("souffle")
    if exe is None:
        raise EngineError("`souffle` is not on PATH")
    mode = mode or requested_mode()
    threads = threads or default_threads()
    if mode == "interpreted":
        return SoufflePlan(exe, "interpreted", None, threads)
    binary = cached_binary(program, exe)
    if binary is None and mode == "compiled":
        binary = compile_binary(program, main_dl, exe, timeout)
    elif binary is None and compiler_available():
        try:
            binary = compile_binary(program, main_dl, exe, timeout)
        except EngineError:
            binary = None  # e.g. headers or libraries missing for linking: the interpreter still works
    if binary is None:
        return SoufflePlan(exe, "interpreted", None, threads)
    return SoufflePlan(exe, "compiled", binary, threads)


def read_outputs(program: Program, out_dir: Path, outputs: Sequence[str]) -> dict[str, list[tuple]]:
    resolve = type_resolver(program)
    result: dict[str, list[tuple]] = {}
    for name in outputs:
        path = out_dir / f"{name}.csv"
        if not path.is_file():
            raise EngineError(f"Soufflé wrote no output file {path}")
        result[name] = read_csv(path, program.column_types(name), resolve)
    return result


def run_souffle(program: Program, main_dl: Path, facts: Mapping[str, Sequence[tuple]],
                outputs: Sequence[str], facts_dir: Path, out_dir: Path,
                timeout: float | None = None, facts_written: bool = False,
                plan: SoufflePlan | None = None) -> dict[str, list[tuple]]:
    """Write the facts (unless already written), run Soufflé, read `outputs`."""
    start = time.perf_counter()
    plan = plan or plan_run(program, main_dl, timeout=timeout)
    if timeout is not None:
        timeout = max(0.001, timeout - (time.perf_counter() - start))
    if not facts_written:
        write_facts_dir(facts_dir, list(program.inputs), facts)
    out_dir.mkdir(parents=True, exist_ok=True)
    if plan.mode == "compiled":
        assert plan.binary is not None
        cmd = [str(plan.binary), "-j", str(plan.threads), "-F", str(facts_dir), "-D", str(out_dir)]
    else:
        cmd = souffle_command(main_dl.resolve(), facts_dir, out_dir, plan.exe, plan.threads)
    _run(cmd, timeout, "evaluation" if plan.mode == "compiled" else "interpreter run", program)
    return read_outputs(program, out_dir, outputs)

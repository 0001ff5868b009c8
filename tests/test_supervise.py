"""dlverify/supervise.py, the per-item supervisor the CLI (and a zoo runner)
runs every case in: values and errors come back, a deadline kills the child
and what it started, a memory limit and crashes are reported as such. The
tasks are small module-level functions (the child imports this module)."""
import os
import signal
import subprocess
import time
from pathlib import Path

from dlverify.errors import InputError
from dlverify.supervise import Limits, parse_memory, run_supervised


def _square(x, reporter):
    reporter.phase("squaring")
    reporter.progress(1, 1)
    return x * x


def _bad_input(reporter):
    raise InputError("bad shape", "model.hlo", 7)


def _busy_with_a_grandchild(pid_file, reporter):
    reporter.phase("busy")
    sleeper = subprocess.Popen(["sleep", "1000"])
    Path(pid_file).write_text(str(sleeper.pid))
    while True:
        pass


def _temp_files_then_hang(record, reporter):
    """Makes a temporary folder as an engine run does, then runs until killed."""
    import tempfile

    reporter.phase("engine")
    Path(record).write_text(tempfile.mkdtemp(prefix="dlverify-souffle-"))
    while True:
        time.sleep(0.05)


def _hog(reporter):
    reporter.phase("allocating")
    return len(bytearray(2 << 30))


def _segfault(reporter):
    reporter.phase("crashing")
    os.kill(os.getpid(), signal.SIGSEGV)


def _broken(reporter):
    reporter.phase("parse")
    return {}["missing"]


def test_a_value_and_the_events_come_back():
    events = []
    out = run_supervised(_square, (7,), on_event=events.append)
    assert (out.status, out.value) == ("ok", 49)
    assert [e.phase for e in events if e.kind == "phase"][-1] == "squaring"
    assert any(e.kind == "progress" and (e.done, e.total) == (1, 1) for e in events)


def test_an_input_error_keeps_its_file_and_line():
    out = run_supervised(_bad_input, ())
    assert out.status == "input_error"
    assert str(out.input_error()) == "model.hlo:7: bad shape"


def test_the_deadline_kills_the_child_and_what_it_started(tmp_path):
    pid_file = tmp_path / "pid"
    t0 = time.monotonic()
    out = run_supervised(_busy_with_a_grandchild, (str(pid_file),), Limits(seconds=2))
    assert out.status == "out_of_time" and out.phase == "busy", out
    assert time.monotonic() - t0 < 4
    pid = int(pid_file.read_text())
    for _ in range(50):  # the grandchild was in the child's process group
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"sleep {pid} survived its parent's deadline")


def test_a_memory_limit_is_out_of_memory_not_a_crash():
    out = run_supervised(_hog, (), Limits(memory_bytes=parse_memory("512M")))
    assert out.status == "out_of_memory" and out.phase == "allocating", out
    assert "512M" in out.message


def test_a_crash_and_an_internal_error_are_reported_as_such():
    out = run_supervised(_segfault, ())
    assert out.status == "crashed" and "SIGSEGV" in out.message and out.phase == "crashing"
    out = run_supervised(_broken, ())
    assert out.status == "internal_error"
    assert out.message == "internal error in parse: KeyError: 'missing'"


def test_temporary_files_of_a_child_killed_at_its_deadline_are_removed(tmp_path):
    record = tmp_path / "made"
    out = run_supervised(_temp_files_then_hang, (str(record),), Limits(seconds=3))
    assert out.status == "out_of_time"
    made = Path(record.read_text())
    assert made.name.startswith("dlverify-souffle-")
    assert not made.exists() and not made.parent.exists()

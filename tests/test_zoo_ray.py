"""`dlverify zoo --ray`: a small zoo (the smallest example cases, a hung, a
crashing and a greedy item) on a local Ray cluster (127.0.0.1, two CPUs, no dashboard)
gives the local pool's verdicts; the CLI joins a running cluster by its
address; without Ray, `--ray` is one line naming the extra, exit 2.

One cluster for the module (its start-up is the slow part); the whole file
stays under a minute."""
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlverify.cli import app
from dlverify.zoo import ZooOptions, run_zoo
from dlverify.zoo.display import status_lines
from dlverify.zoo.items import entries_of

from test_zoo import CRASHES, GREEDY, HANGS, tiny, write

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# A case that never returns, asleep (the limit below leaves the item's start-up, which
# imports JAX, room on a loaded machine, so both pools stop it while it builds).
SLEEPS = HANGS.replace("import dlverify\n", "import time\n\nimport dlverify\n").replace(
    "        pass", "        time.sleep(0.05)")
# The smallest bundled cases: a verified one and a planted bug found as expected.
SMALL_CASES = [("ring_shift.py", "ring_shift"),
               ("ring_shift.py", "ring_shift_bug_wrong_direction")]


@pytest.fixture(scope="module")
def ray_cluster():
    """A local cluster for this module, on 127.0.0.1; its GCS address."""
    ray = pytest.importorskip("ray", reason="the Ray extra is not installed: pip install "
                                            "'dlverify[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             logging_level=logging.WARNING)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def without_seconds(line: str) -> str:
    return re.sub(r"  \d+\.\d\ds$", "", line)


def test_ray_gives_the_local_pools_verdicts(ray_cluster, tmp_path):
    """The command, as a user runs it, joins the cluster by its address (a second
    driver); its item lines are the local pool's, times left out."""
    manifest = write(tmp_path, "zoo.toml", "".join(
        f'[[cases]]\npath = "{EXAMPLES / file}"\nname = "{name}"\n' for file, name in SMALL_CASES)
        + '[[cases]]\npath = "hangs.py"\ntimeout = 10\n[[cases]]\npath = "crashes.py"\n'
        + '[[cases]]\npath = "greedy.py"\nmax_memory = "1G"\n')  # also 1G of Ray's memory
    write(tmp_path, "hangs.py", SLEEPS)
    write(tmp_path, "crashes.py", CRASHES)
    write(tmp_path, "greedy.py", GREEDY)
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, "-m", "dlverify.cli", "zoo", str(manifest), "--jobs", "2",
                          "--engine", "clingo", "--ray", ray_cluster, "--cache-dir",
                          str(tmp_path / "cache"), "--report-dir", str(out)],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert res.returncode == 3, res.stdout + res.stderr  # the hang: out of its time limit
    *lines, summary = res.stdout.splitlines()
    local = run_zoo(entries_of([str(manifest)]),
                    ZooOptions(jobs=2, engine="clingo", cache_dir=tmp_path / "cache",
                               use_cache=False))
    assert sorted(map(without_seconds, lines)) == sorted(
        without_seconds(line) for r in local.results for line in status_lines(r))
    assert summary.split(";")[0] == local.summary().split(";")[0] == (
        "summary: 5 items: 1 verified, 1 bug found as expected, 0 mismatches, 3 errors "
        "(1 out of time, 1 out of memory, 1 crashed)")
    assert any(line.startswith("ERROR") and "hangs.py::hangs: out of time after 10 s" in line
               for line in lines)
    assert any(line.startswith("ERROR") and "SIGSEGV" in line for line in lines)
    report = json.loads((out / "zoo.json").read_text())
    assert len(report["cases"]) == 5 and (out / "index.html").is_file()


def test_without_ray_the_option_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny(tmp_path, "x.py")
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    res = CliRunner().invoke(app, ["zoo", "x.py", "--ray", "auto", "--cache-dir",
                                   str(tmp_path / "c"), "--report-dir", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and "pip install 'dlverify[ray]'" in res.output
    assert not (tmp_path / "out" / "index.html").exists()


def test_a_task_lost_with_its_worker_is_a_result_of_the_item():
    ray = pytest.importorskip("ray", reason="the Ray extra is not installed")
    from dlverify.zoo.ray_backend import lost_outcome

    x = ray.exceptions
    crashed = lost_outcome(ray, x.WorkerCrashedError(), 1.5)
    assert crashed.status == "crashed" and "WorkerCrashedError" in crashed.message
    assert crashed.seconds == 1.5 and not crashed.hit_limit
    killed = lost_outcome(ray, x.OutOfMemoryError("node memory over 95%"), 2.0)
    assert killed.status == "out_of_memory" and killed.hit_limit
    assert "node memory over 95%" in killed.message
    other = lost_outcome(ray, x.TaskUnschedulableError("no node fits"), 0.1)
    assert other.status == "internal_error" and "no node fits" in other.message


def test_an_address_where_no_cluster_answers_is_one_line_exit_2(tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="the Ray extra is not installed")
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.chdir(tmp_path)
    tiny(tmp_path, "x.py")
    res = CliRunner().invoke(app, ["zoo", "x.py", "--ray", f"127.0.0.1:{port}", "--cache-dir",
                                   str(tmp_path / "c"), "--report-dir", str(tmp_path / "out")])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and f"no Ray cluster answers at 127.0.0.1:{port}" in res.output

"""`--jobs N` of check-jax and check-dump (dlverify/jobs.py): the units (cases,
module pairs) run in parallel children, and the report is the one --jobs 1
prints (same order, same content; only the times differ); --max-memory holds
in each child; a bad --jobs is one line and exit 2. No timed assertions."""
import json
import re
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlverify.cli import EXIT_INPUT, EXIT_MISMATCH, EXIT_OK, EXIT_RESOURCES, app

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "megatron_mlp.py"
SPECS = ROOT / "tests" / "data" / "hostile" / "specs"


def run(*args) -> "object":
    return CliRunner().invoke(app, [str(a) for a in args])


def untimed(doc):
    """A JSON report without its times."""
    if isinstance(doc, dict):
        return {k: untimed(v) for k, v in doc.items() if k not in ("seconds", "timings")}
    if isinstance(doc, list):
        return [untimed(v) for v in doc]
    return doc


def untimed_text(text: str) -> list[str]:
    return [re.sub(r"\d+\.\d+s\b", "<t>", line) for line in text.splitlines()]


def test_check_jax_reports_the_same_for_jobs_1_and_2():
    one = run("check-jax", MLP, "--json", "--jobs", "1")
    two = run("check-jax", MLP, "--json", "-j", "2")
    assert one.exit_code == two.exit_code == EXIT_OK, two.output
    doc1, doc2 = json.loads(one.stdout), json.loads(two.stdout)
    assert [c["name"] for c in doc2["cases"]] == [c["name"] for c in doc1["cases"]]
    assert len(doc1["cases"]) == 6
    assert untimed(doc2) == untimed(doc1)


def _dump(tmp: Path, modules: dict[str, str]) -> Path:
    """A dump folder: each module the hostile specs' pair, its partitioned side `dist`."""
    seq = (SPECS / "seq.hlo").read_text()
    dump = tmp / "dump"
    dump.mkdir()
    for module, dist in modules.items():
        (dump / f"{module}.before_optimizations.txt").write_text(seq)
        (dump / f"{module}.after_optimizations.txt").write_text(dist)
    return dump


def test_check_dump_reports_the_same_for_jobs_1_and_2(tmp_path):
    """Three modules, the second one wrong (exp instead of tanh): the same lines in
    the same order, the same failing-subgraph files, the same exit code."""
    good = (SPECS / "dist.hlo").read_text()
    bad = good.replace("tanh(x)", "exponential(x)")
    dump = _dump(tmp_path, {"module_0001.jit_f": good, "module_0002.jit_g": bad,
                            "module_0003.jit_h": good})
    outs = []
    for jobs in ("1", "2"):
        graphs = tmp_path / f"g{jobs}"
        graphs.mkdir()
        r = run("check-dump", dump, "--jobs", jobs, "--graph", graphs / "g.dot")
        assert r.exit_code == EXIT_MISMATCH, r.output
        outs.append(([line.replace(str(graphs), "G") for line in untimed_text(r.stdout)],
                     sorted(p.name for p in graphs.iterdir())))
    assert outs[1] == outs[0]
    lines, graphs = outs[0]
    heads = [line for line in lines if not line.startswith(" ")]
    assert [h.split()[0] for h in heads[:3]] == ["verified", "NOT", "verified"]
    assert "module_0002.jit_g" in heads[1]
    assert heads[3].startswith("summary: 3 module pairs: 2 verified, ")
    assert graphs == ["g.module_0002.jit_g.dot"]
    one = run("check-dump", dump, "--json")
    two = run("check-dump", dump, "--json", "--jobs", "3")
    assert untimed(json.loads(two.stdout)) == untimed(json.loads(one.stdout))


def test_check_dump_an_error_in_one_module_is_the_same_one_line_for_any_jobs(tmp_path):
    """The folder's child stops at the first module without a verdict; in parallel
    the first such module in folder order is the one reported, alone."""
    good = (SPECS / "dist.hlo").read_text()
    dump = _dump(tmp_path, {"module_0001.jit_f": good, "module_0002.jit_g": "HloModule broken\n",
                            "module_0003.jit_h": good.replace("tanh(x)", "tanhh(x)")})
    results = [run("check-dump", dump, "--jobs", jobs) for jobs in ("1", "2")]
    for r in results:
        assert r.exit_code == EXIT_INPUT, r.output
        lines = [line for line in r.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output
        assert "module_0002.jit_g" in lines[0]
    assert results[0].output == results[1].output


def test_check_dump_without_partitioned_module_is_exit_2_for_any_jobs(tmp_path):
    seq = (SPECS / "seq.hlo").read_text()
    dump = _dump(tmp_path, {"module_0001.jit_f": seq})  # one device: not partitioned
    (dump / "module_0002.jit_g.before_optimizations.txt").write_text(seq)  # never compiled
    results = [run("check-dump", dump, "--jobs", jobs) for jobs in ("1", "2")]
    assert [r.exit_code for r in results] == [EXIT_INPUT, EXIT_INPUT]
    assert "no SPMD-partitioned module" in results[0].output
    assert results[0].output == results[1].output


CASES = '''\
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

import dlverify


def _case():
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    dist = jax.shard_map(lambda x: x * 2, mesh=mesh, in_specs=(P("x"),), out_specs=P("x"))
    return dlverify.Case(seq=lambda x: x * 2, dist=dist,
                         args=(jax.ShapeDtypeStruct((4, 4), jnp.float32),))


@dlverify.case
def first():
    return _case()


@dlverify.case
def hog():
    hoard = []
    while True:  # over any --max-memory
        hoard.append(bytearray(64 << 20))


@dlverify.case
def last():
    return _case()
'''


def test_the_memory_limit_holds_in_each_parallel_child(tmp_path):
    path = tmp_path / "cases.py"
    path.write_text(textwrap.dedent(CASES))
    r = run("check-jax", path, "--jobs", "2", "--max-memory", "1G")
    assert r.exit_code == EXIT_RESOURCES, r.output
    assert [line.split()[:2] for line in r.stdout.splitlines() if not line.startswith(" ")][:2] \
        == [["ok", "first"], ["ok", "last"]]
    assert "error: hog: out of memory" in r.stderr and "Traceback" not in r.output
    assert r.stdout.splitlines()[-1].startswith("summary: 3 cases: 2 verified, 0 bugs found "
                                                "as expected, 0 mismatches, 1 error")


@pytest.mark.parametrize("command", ["check-jax", "check-dump"])
@pytest.mark.parametrize("jobs", ["0", "257", "-1"])
def test_a_bad_jobs_count_is_one_line_and_exit_2(command, jobs, tmp_path):
    r = run(command, MLP if command == "check-jax" else tmp_path, "--jobs", jobs)
    assert r.exit_code == EXIT_INPUT, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert lines == [f"error: --jobs {jobs}: expected 1..256"]

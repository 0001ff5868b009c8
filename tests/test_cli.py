"""The `dlverify check-jax` command through typer's CliRunner: exit codes,
text and JSON reports, and one-line errors for malformed input."""
import json
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlverify.cli import app

ROOT = Path(__file__).resolve().parent.parent
MLP = ROOT / "examples" / "megatron_mlp.py"
MLP_CASES = ["megatron_mlp_tp2", "megatron_mlp_tp4", "megatron_mlp_bug_missing_psum",
             "megatron_mlp_bug_bias_before_psum", "megatron_mlp_out_gelu",
             "megatron_mlp_bug_gelu_on_partial_sum"]

HEADER = '''\
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, PartitionSpec as P

import dlverify

F32 = jnp.float32


def mesh(n):
    return Mesh(np.array(jax.devices()[:n]), ("x",))


def ident(x):
    return x


def case_of(seq, local, in_specs=(P(),), out_specs=P(), shape=(4, 4), **kw):
    dist = jax.shard_map(local, mesh=mesh(2), in_specs=in_specs, out_specs=out_specs)
    return dlverify.Case(seq=seq, dist=dist, args=(jax.ShapeDtypeStruct(shape, F32),), **kw)
'''


def invoke(*args: str):
    return CliRunner().invoke(app, ["check-jax", *args])


def write_case(tmp_path: Path, body: str, name: str = "cases.py") -> tuple[Path, int]:
    """A case file: HEADER + body; returns its path and the line marked `# HERE` (0 if none)."""
    text = HEADER + "\n\n" + textwrap.dedent(body)
    path = tmp_path / name
    path.write_text(text)
    marked = [i + 1 for i, line in enumerate(text.splitlines()) if "# HERE" in line]
    return path, (marked[0] if marked else 0)


def status_lines(stdout: str) -> list[str]:
    """The one line per case (detail lines are indented)."""
    return [line for line in stdout.splitlines()
            if line and not line.startswith(" ") and not line.startswith("summary: ")]


def one_error_line(res) -> str:
    assert "Traceback" not in res.output and "Traceback" not in res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


# ---------------------------------------------------------------- verdicts

def test_every_case_of_a_file_one_line_each_exit_0():
    res = invoke(str(MLP))
    assert res.exit_code == 0, res.output
    assert res.stderr == ""
    lines = status_lines(res.stdout)
    assert [line.split()[1] for line in lines] == MLP_CASES
    for line in lines:  # a bug the case expects is reported as expected, not as "not verified"
        if "_bug_" in line.split()[1]:
            assert line.startswith(f"expected  {line.split()[1]}  bug found as expected  "), line
        else:
            assert line.startswith("ok "), line
    verified = {line.split()[1] for line in lines if line.split()[2] == "verified"}
    assert verified == {"megatron_mlp_tp2", "megatron_mlp_tp4", "megatron_mlp_out_gelu"}
    assert "  out0 = r0.out0  (replicated on all 4 ranks)" in res.stdout.splitlines()
    assert res.stdout.splitlines()[-1].startswith(
        "summary: 6 cases: 3 verified, 3 bugs found as expected, 0 mismatches, 0 errors; ")


def test_selecting_one_case_by_name():
    res = invoke(f"{MLP}::megatron_mlp_tp4")
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert len(status_lines(res.stdout)) == 1
    assert lines[0].startswith("ok        megatron_mlp_tp4  verified  ")
    assert lines[1] == "  out0 = r0.out0  (replicated on all 4 ranks)"


def test_json_report():
    res = invoke(str(MLP), "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["schema_version"] == 1
    cases = {c["name"]: c for c in report["cases"]}
    assert list(cases) == MLP_CASES
    for c in report["cases"]:
        assert c["matches_expectation"] is True
        assert c["file"] == str(MLP)
        assert c["verdict"] == ("bug" if "_bug_" in c["name"] else "verified")
        assert c["result"]["verified"] == (c["verdict"] == "verified")
    ok = cases["megatron_mlp_tp2"]["result"]
    assert ok["failures"] == [] and ok["outputs"] == ["out0 = r0.out0  (replicated on all 2 ranks)"]
    bug_line = next(i + 1 for i, line in enumerate(MLP.read_text().splitlines())
                    if "# BUG: missing psum" in line)
    first = cases["megatron_mlp_bug_missing_psum"]["result"]["failures"][0]
    assert first["op"] == "dot_general"
    assert first["file"] == str(MLP) and first["line"] == bug_line
    assert "partial result never reduced" in first["message"]
    assert (first["frames"][0]["file"], first["frames"][0]["line"]) == (str(MLP), bug_line)


def test_a_case_whose_expectation_is_wrong_exits_1(tmp_path):
    path, _ = write_case(tmp_path, '''
        def double(x):
            return x * 2.0


        @dlverify.case
        def says_bug():
            return case_of(double, double, in_specs=(P("x"),), out_specs=P("x"), expect="bug")


        @dlverify.case
        def really_a_bug():   # no expect: must verify, but psum(2 x) over 2 ranks is 4 x
            return case_of(double, lambda x: jax.lax.psum(x * 2.0, "x"))
    ''')
    res = invoke(str(path))
    assert res.exit_code == 1, res.output
    lines = status_lines(res.stdout)
    assert lines[0].startswith("MISMATCH  says_bug  verified (expected bug)")
    assert lines[1].startswith("MISMATCH  really_a_bug  not verified (expected verified)")
    res = invoke(f"{path}::says_bug", "--json")
    assert res.exit_code == 1
    (c,) = json.loads(res.stdout)["cases"]
    assert (c["verdict"], c["expect"], c["matches_expectation"]) == ("verified", "bug", False)


def test_a_correct_case_file_of_ours_exits_0(tmp_path):
    path, _ = write_case(tmp_path, '''
        def seq(x):
            return jnp.tanh(x) * 2.0


        def local(x):
            return jnp.tanh(x) * 2.0


        @dlverify.case
        def sharded_tanh():
            return case_of(seq, local, in_specs=(P("x"),), out_specs=P("x"))
    ''')
    res = invoke(str(path))
    assert res.exit_code == 0, res.output
    assert res.stdout.splitlines()[1] == "  out0 = concat(r0.out0, r1.out0; dim 0)"


# ---------------------------------------------------------------- bad input: exit 2, one line

def test_missing_file(tmp_path):
    missing = tmp_path / "nope.py"
    res = invoke(str(missing))
    assert res.exit_code == 2
    assert one_error_line(res) == f"error: {missing}: no such file"


def test_syntax_error_names_file_and_line(tmp_path):
    path, line = write_case(tmp_path, '''
        def broken(:   # HERE
            pass
    ''')
    res = invoke(str(path))
    assert res.exit_code == 2
    assert one_error_line(res).startswith(f"error: {path}:{line}: syntax error")


def test_import_time_exception_names_file_and_line(tmp_path):
    path, line = write_case(tmp_path, '''
        raise RuntimeError("boom")   # HERE
    ''')
    res = invoke(str(path))
    assert res.exit_code == 2
    assert one_error_line(res) == f"error: {path}:{line}: importing failed: RuntimeError: boom"


def test_a_case_returning_something_else(tmp_path):
    path, _ = write_case(tmp_path, '''
        @dlverify.case
        def not_a_case():
            return 42
    ''')
    res = invoke(str(path))
    assert res.exit_code == 2
    assert one_error_line(res) == f"error: {path}: case not_a_case returned int, not dlverify.Case"


def test_a_case_with_an_unknown_expectation(tmp_path):
    path, _ = write_case(tmp_path, '''
        @dlverify.case
        def maybe():
            return case_of(ident, ident, expect="maybe")
    ''')
    res = invoke(str(path))
    assert res.exit_code == 2
    assert "expect must be 'verified' or 'bug', not 'maybe'" in one_error_line(res)


def test_an_unknown_case_name_and_an_unknown_engine():
    res = invoke(f"{MLP}::no_such_case")
    assert res.exit_code == 2
    assert one_error_line(res).startswith(f"error: {MLP}: no case named 'no_such_case'")
    res = invoke(str(MLP), "--engine", "prolog")
    assert res.exit_code == 2
    assert one_error_line(res) == "error: unknown engine 'prolog': use auto, clingo or souffle"


UNKNOWN_PRIMITIVES = {
    "bessel_i1e": ("lax.bessel_i1e(x)", "bessel_i1e"),
    "igamma": ("lax.igamma(x * x + 1.0, x * x + 2.0)", "igamma"),
    "qr": ("jnp.linalg.qr(x)[0]", "qr"),
}


def _unknown_primitive_case(tmp_path, which):
    expr, prim = UNKNOWN_PRIMITIVES[which]
    path, line = write_case(tmp_path, f'''
        def seq(x):
            return {expr}   # HERE


        @dlverify.case
        def unknown():
            return case_of(seq, ident)
    ''')
    return path, line, prim


@pytest.mark.parametrize("which", ["bessel_i1e", "igamma", "qr"])
def test_an_unknown_jax_primitive_in_seq_fn(tmp_path, which):
    path, _, prim = _unknown_primitive_case(tmp_path, which)
    res = invoke(str(path))
    assert res.exit_code == 2
    assert f"unknown primitive '{prim}' (no exporter in frontends/jaxpr/)" in one_error_line(res)


@pytest.mark.parametrize("which", [
    "bessel_i1e", "igamma",
    "qr",  # traced inside jnp.linalg's own jit: located at the user's call
])
def test_the_unknown_primitive_error_names_file_and_line(tmp_path, which):
    path, line, prim = _unknown_primitive_case(tmp_path, which)
    res = invoke(str(path))
    assert one_error_line(res).startswith(f"error: {path}:{line}: unknown primitive '{prim}'")


def test_a_while_loop_on_data_is_refused_at_its_line(tmp_path):
    path, line = write_case(tmp_path, '''
        def seq(x):
            return lax.while_loop(lambda c: jnp.sum(c) < 100.0, lambda c: c * 2.0, x)   # HERE


        @dlverify.case
        def data_loop():
            return case_of(seq, ident)
    ''')
    res = invoke(str(path))
    assert res.exit_code == 2
    assert one_error_line(res).startswith(f"error: {path}:{line}: while loop whose condition is "
                                          "not known before run time")


def test_an_in_spec_naming_a_mesh_axis_that_does_not_exist(tmp_path):
    path, _ = write_case(tmp_path, '''
        @dlverify.case
        def bad_axis():
            return case_of(ident, ident, in_specs=(P("y"),), out_specs=P("y"))
    ''')
    res = invoke(str(path))
    assert res.exit_code == 2
    line = one_error_line(res)
    assert str(path) in line and "'y'" in line


def test_a_dim_not_divisible_by_the_mesh_axis(tmp_path):
    path, _ = write_case(tmp_path, '''
        @dlverify.case
        def uneven():
            return case_of(ident, ident, in_specs=(P("x"),), out_specs=P("x"), shape=(5, 4))
    ''')
    res = invoke(str(path))
    assert res.exit_code == 2
    line = one_error_line(res)
    assert str(path) in line and "divisible" in line


def test_report_flags_write_sarif_junit_graph_and_witness(tmp_path):
    sarif, junit, graph = tmp_path / "r.sarif", tmp_path / "r.xml", tmp_path / "g.dot"
    res = invoke("examples/megatron_mlp.py::megatron_mlp_bug_missing_psum", "--witness",
                 "--sarif", str(sarif), "--junit", str(junit), "--graph", str(graph))
    assert res.exit_code == 0, res.output
    assert "witness: confirmed numerically" in res.stdout
    import json as _json
    log = _json.loads(sarif.read_text())
    assert log["version"] == "2.1.0" and log["runs"][0]["results"][0]["ruleId"] == "unreduced-partial"
    assert "<testsuite" in junit.read_text() and 'failures="0"' in junit.read_text()
    assert graph.read_text().startswith("digraph")


def test_explain_flag_traces_an_output_to_the_inputs():
    res = invoke("examples/ring_shift.py::ring_shift", "--explain", "out0@2")
    assert res.exit_code == 0, res.output
    assert "rank 2: out0 = out0[8:12, 0:8]" in res.stdout
    assert "input relation" in res.stdout
    bad = invoke("examples/ring_shift.py::ring_shift", "--explain", "logits")
    assert bad.exit_code == 2 and "no output named 'logits'" in bad.stderr


# ---------------------------------------------------------------- manners

def test_version():
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0
    assert res.stdout.startswith("dlverify ") and len(res.stdout.split()) == 2


HOSTILE = ROOT / "tests" / "data" / "hostile"


def test_check_dump_graph_writes_one_file_per_module(tmp_path):
    """Two modules whose partitioned version is wrong (exp instead of tanh):
    one failing-subgraph file each, not one overwritten file."""
    seq = (HOSTILE / "specs" / "seq.hlo").read_text()
    dist = (HOSTILE / "specs" / "dist.hlo").read_text().replace("tanh(x)", "exponential(x)")
    dump = tmp_path / "dump"
    dump.mkdir()
    for module in ("module_0001.jit_f", "module_0002.jit_g"):
        (dump / f"{module}.before_optimizations.txt").write_text(seq)
        (dump / f"{module}.after_optimizations.txt").write_text(dist)
    res = CliRunner().invoke(app, ["check-dump", str(dump), "--graph", str(tmp_path / "g.dot")])
    assert res.exit_code == 1, res.output
    assert sorted(p.name for p in tmp_path.glob("g*.dot")) == [
        "g.module_0001.jit_f.dot", "g.module_0002.jit_g.dot"]
    assert all(p.read_text().startswith("digraph") for p in tmp_path.glob("g*.dot"))
    assert res.stdout.splitlines()[-1].startswith("summary: 2 module pairs: 0 verified, "
                                                  "0 bugs found as expected, 2 mismatches")


def test_a_limit_ends_the_run_with_exit_3_and_names_the_phase(tmp_path):
    path, _ = write_case(tmp_path, '''
        def seq(x):
            while True:
                pass


        @dlverify.case
        def endless():
            return case_of(seq, ident)
    ''')
    res = invoke(str(path), "--timeout", "2")
    assert res.exit_code == 3, res.output
    assert one_error_line(res).startswith("error: out of time: the run's limit of 2 s was "
                                          "reached while in phase trace of endless")


def test_the_python_api_on_one_device_is_an_error_not_a_proof(tmp_path):
    """Without XLA_FLAGS JAX sees one CPU device: a mesh asked for 2 devices
    is cut to 1, and a 1-rank 'distributed' program would verify trivially."""
    import os
    import subprocess
    import sys

    script = tmp_path / "one_device.py"
    script.write_text(textwrap.dedent('''
        import jax, jax.numpy as jnp, numpy as np
        from jax.sharding import Mesh, PartitionSpec as P
        import dlverify
        from dlverify.errors import InputError

        mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
        dist = jax.shard_map(lambda x: x * 2.0, mesh=mesh, in_specs=(P("x"),), out_specs=P("x"))
        try:
            dlverify.verify_jax(lambda x: x, dist, jax.ShapeDtypeStruct((4,), jnp.float32))
        except InputError as e:
            print("InputError:", e)
    '''))
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "InputError: JAX sees only 1 device" in p.stdout, p.stdout + p.stderr[-2000:]


# ---------------------------------------------------------------- --cache and the segment plan

DEEP = '''
LAYERS = 40


def layers(x):
    for _ in range(LAYERS):
        x = jnp.exp(jnp.tanh(x) + jnp.sin(x))
    return x


@dlverify.case
def deep_chain():
    return case_of(layers, layers, in_specs=(P("x"),), out_specs=P("x"))
'''


def _without_times(lines: list[str]) -> list[str]:
    """The report minus what changes from run to run: seconds, the plan, timings."""
    import re
    return [re.sub(r"\d+\.\d+s", "_s", line) for line in lines
            if not line.startswith(("  plan: ", "  time: ", "summary: "))]


def test_cache_serves_every_segment_of_a_second_run_from_disk(tmp_path):
    """160 ops: more than one 96-op window, so the run is segmented; the second
    run with the same --cache reads every segment back and runs no engine."""
    path, _ = write_case(tmp_path, DEEP)
    cache = tmp_path / "cache"
    first = invoke(str(path), "--cache", str(cache), "-v")
    assert first.exit_code == 0, first.output
    plan1 = [line for line in first.stdout.splitlines() if line.startswith("  plan: ")]
    segments = [line for line in plan1 if line.startswith("  plan: segment ")]
    assert len(segments) >= 2, first.stdout
    assert any(" engine runs, " in line and "(0 from the on-disk cache)" in line
               and not line.startswith(f"  plan: {len(segments)} segments: 0 engine runs")
               for line in plan1), plan1
    assert any(cache.rglob("*.json")), "nothing written to the cache"

    again = invoke(str(path), "--cache", str(cache), "-v")
    assert again.exit_code == 0, again.output
    plan2 = [line for line in again.stdout.splitlines() if line.startswith("  plan: ")]
    n = len(segments)
    assert f"  plan: {n} segments: 0 engine runs, {n} memo hits ({n} from the on-disk cache)" \
        in plan2, plan2
    assert all(", cache " in line for line in plan2 if line.startswith("  plan: segment ")), plan2
    assert _without_times(again.stdout.splitlines()) == _without_times(first.stdout.splitlines())


def test_no_plan_lines_without_verbose_or_for_one_fixpoint():
    quiet = invoke("examples/ring_shift.py::ring_shift", "-v")
    assert quiet.exit_code == 0, quiet.output
    assert "  time: " in quiet.stdout
    assert "plan: " not in quiet.stdout  # small: one fixpoint, no segments


def test_cache_must_be_a_writable_folder(tmp_path):
    not_dir = tmp_path / "a_file"
    not_dir.write_text("")
    res = invoke("examples/ring_shift.py::ring_shift", "--cache", str(not_dir))
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [
        f"error: {not_dir}: --cache: exists and is not a folder"], res.stderr
    hlo = ROOT / "tests" / "data" / "mutants"
    res = CliRunner().invoke(app, ["check", str(hlo / "jax_flatten_seq.hlo"),
                                   str(hlo / "jax_flatten_dist.hlo"), "--cache", str(not_dir)])
    assert res.exit_code == 2 and "--cache: exists and is not a folder" in res.stderr
    res = CliRunner().invoke(app, ["check-dump", str(tmp_path), "--cache", str(not_dir)])
    assert res.exit_code == 2 and "--cache: exists and is not a folder" in res.stderr

"""The `dlverify check` and `dlverify check-dump` commands through typer's
CliRunner: exit codes 0/1/2/3, the printed reconstruction or located failure
(with the Python stack of the Neuron metadata), JSON, and one-line errors
naming file and line for malformed HLO and wrong specs."""
# XLA_FLAGS (8 host devices, explicit replica groups): tests/conftest.py
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from dlverify.cli import EXIT_INPUT, EXIT_MISMATCH, EXIT_OK, EXIT_RESOURCES, app  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
NEURON = DATA / "neuron_llama"
MUT = DATA / "mutants"
TP1, TP2, SPEC = NEURON / "tp1_layer1.hlo", NEURON / "tp2_layer1.hlo", NEURON / "tp2.toml"


def run(*args: str):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_check_neuron_prints_the_reconstruction_and_assumptions():
    r = run("check", TP1, TP2, "--spec", SPEC)
    assert r.exit_code == EXIT_OK, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("verified") and "tp1_layer1.hlo vs tp2_layer1.hlo" in lines[0]
    assert "  out0 = concat(r0.out0, r1.out0; dim 0)" in lines
    assert "  out1 = concat(r0.out1, r1.out1; dim 2)" in lines
    assert "  assumption: constant %constant.22 elided in both files; assumed equal" in lines


def test_check_mutant_prints_the_instruction_and_the_python_stack():
    mutant = MUT / "tp2_layer1_wrong_group.hlo"
    r = run("check", TP1, mutant, "--spec", SPEC)
    assert r.exit_code == EXIT_MISMATCH, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("NOT verified")
    assert lines[1].startswith("  all_reduce at tp2_layer1_wrong_group.hlo:133: ")
    assert "replica_groups" not in lines[1] and "[[0], [1]]" in lines[1]
    assert lines[2].startswith("      at instruction %all-reduce.127 (tp2_layer1_wrong_group.hlo:133)"
                               "; source: hlo.py:1200 <- hlo.py:1250 <- attention.py:913")
    assert lines[2].endswith("test.py:46")


def test_check_ranks_flag_and_verbose():
    r = run("check", MUT / "jax_flatten_seq.hlo", MUT / "jax_flatten_dist.hlo", "--ranks", "2", "-v")
    assert r.exit_code == EXIT_OK, r.output
    assert "  assumption: output relation inferred: out0 = r0.out0  (replicated on all 2 ranks)" \
        in r.output.splitlines()
    assert "  time: " in r.output
    r = run("check", MUT / "jax_flatten_seq.hlo", MUT / "jax_flatten_dist.hlo", "--ranks", "4")
    assert r.exit_code == EXIT_INPUT
    assert "--ranks says 4 ranks but the module declares" in r.output


def test_check_json():
    r = run("check", TP1, MUT / "tp2_layer1_no_allreduce.hlo", "--spec", SPEC, "--json")
    assert r.exit_code == EXIT_MISMATCH
    doc = json.loads(r.output)
    assert doc["schema_version"] == 1
    (case,) = doc["cases"]
    assert case["verdict"] == "bug" and case["name"] == "tp1_layer1.hlo vs tp2_layer1_no_allreduce.hlo"
    first = case["result"]["failures"][0]
    assert first["kind"] == "unreduced-partial" and first["line"] == 152
    assert first["frames"][0]["function"] == "dot.143"


def test_check_custom_calls_file(tmp_path):
    # without the registry entry the custom call is unknown: exit 2 naming it
    dist = tmp_path / "d.hlo"
    dist.write_text(TP2.read_text().replace("AwsNeuronRmsNorm", "MyRmsNorm"))
    r = run("check", TP1, dist, "--spec", SPEC)
    assert r.exit_code == EXIT_INPUT
    assert "custom call target 'MyRmsNorm' is not in the custom-call registry" in r.output
    reg = tmp_path / "calls.toml"
    reg.write_text('MyRmsNorm = { expand = "rms_norm", operands = ["input", "weight", "epsilon"], '
                   'dim = "backend_config" }\n')
    r = run("check", TP1, dist, "--spec", SPEC, "--custom-calls", reg)
    assert r.exit_code == EXIT_OK, r.output
    assert f"custom call MyRmsNorm assumed to compute rms_norm(input, weight, epsilon) over dim 0 " \
           f"({reg})" in r.output


def error_line(r) -> str:
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1, r.output
    return lines[0]


@pytest.mark.parametrize("edit, where, what", [
    (lambda t: t[:100000], 72, "unexpected end of file"),
    (lambda t: t.replace("multiply(%broadcast.62, %slice.63)", "multiplx(%broadcast.62, %slice.63)"),
     72, "unknown HLO opcode 'multiplx'"),
    (lambda t: t.replace("%reshape.56 = f16[64,4,16,64]", "%reshape.56 = f16[64,4,1x6,64]"), 70,
     "bad shape f16[64,4,1x6,64]"),
    (lambda t: t.replace("%reshape.56 = f16[64,4,16,64]", "%reshape.56 = f16[64,4,16,65]"), 70,
     "changes the element count"),
])
def test_malformed_hlo_is_one_line_with_file_and_line(tmp_path, edit, where, what):
    bad = tmp_path / "bad.hlo"
    bad.write_text(edit(TP2.read_text()))
    r = run("check", TP1, bad, "--spec", SPEC)
    assert r.exit_code == EXIT_INPUT
    line = error_line(r)
    assert line.startswith(f"error: {bad}:{where}: ") and what in line


def test_wrong_spec_and_missing_files(tmp_path):
    r = run("check", TP1, TP2, "--spec", NEURON / "tp2_layer2.toml")
    assert r.exit_code == EXIT_INPUT
    assert error_line(r).startswith(f"error: {NEURON / 'tp2_layer2.toml'}:27: the spec names parameter 17")
    r = run("check", TP1, tmp_path / "nope.hlo", "--spec", SPEC)
    assert r.exit_code == EXIT_INPUT and "cannot read HLO file" in error_line(r)
    no_groups = tmp_path / "no_groups.hlo"  # no spec, --ranks, num_partitions or replica group
    no_groups.write_text(Path(TP2).read_text().replace("replica_groups={{0,1}}", "replica_groups={}"))
    r = run("check", TP1, no_groups)
    assert r.exit_code == EXIT_INPUT and "the number of ranks is unknown" in error_line(r)
    r = run("check", TP1, TP2, "--engine", "prolog")
    assert r.exit_code == EXIT_INPUT and "unknown engine" in error_line(r)


def test_timeout_is_exit_3():
    r = run("check", NEURON / "tp1_layer2.hlo", NEURON / "tp2_layer2.hlo", "--spec",
            NEURON / "tp2_layer2.toml", "--timeout", "0.001")
    assert r.exit_code == EXIT_RESOURCES
    assert "out of time" in error_line(r)


@pytest.fixture(scope="module")
def dump_dir():
    import jax
    from jax.sharding import PartitionSpec as P

    import jax_models as M
    from dlverify.frontends.jax_compiled import DUMP_OPTIONS

    d = Path(tempfile.mkdtemp(prefix="dlverify-cli-dump-"))
    args = M.mlp_args()
    M.mlp_jit(M.mesh()).lower(*args).compile(compiler_options={"xla_dump_to": str(d), **DUMP_OPTIONS})
    buggy = jax.jit(lambda x, w1, w2: M.mlp(x, w1, w2 * 3),
                    in_shardings=M.shardings(M.mesh(), M.MLP_SPECS),
                    out_shardings=M.shardings(M.mesh(), P("data", None)))
    buggy.lower(*args).compile(compiler_options={"xla_dump_to": str(d), **DUMP_OPTIONS})
    yield d
    shutil.rmtree(d)


def test_check_dump_verdict_per_module(dump_dir):
    r = run("check-dump", dump_dir)
    # the second module multiplies w2 by 3 in its own program: both sides agree, so it
    # verifies too (check-dump compares each module with itself before partitioning)
    assert r.exit_code == EXIT_OK, r.output
    heads = [line for line in r.output.splitlines() if not line.startswith(" ")]
    assert heads[-1].startswith("summary: 2 module pairs: 2 verified, ")
    heads = heads[:-1]
    assert len(heads) == 2 and all(h.startswith("verified") for h in heads)
    assert "jit_mlp (before optimizations vs after SPMD partitioning)" in heads[0]
    doc = json.loads(run("check-dump", dump_dir, "--json").output)
    assert [c["verdict"] for c in doc["cases"]] == ["verified", "verified"]


def test_check_dump_finds_a_broken_partitioned_module(dump_dir, tmp_path):
    d = tmp_path / "dump"
    shutil.copytree(dump_dir, d)
    (after,) = [f for f in d.iterdir() if "jit_mlp." in f.name and "after_spmd-partitioning" in f.name]
    text = after.read_text()
    assert "replica_groups={{0,1},{2,3}}" in text
    after.write_text(text.replace("replica_groups={{0,1},{2,3}}", "replica_groups={{0,2},{1,3}}"))
    r = run("check-dump", d)
    assert r.exit_code == EXIT_MISMATCH
    line = next(ln for ln in r.output.splitlines() if "all_reduce at" in ln)
    assert line.startswith(f"  all_reduce at {after.name}:")
    r = run("check-dump", tmp_path / "empty")
    assert r.exit_code == EXIT_INPUT and "not a directory" in error_line(r)


def test_check_report_flags_on_hlo(tmp_path):
    sarif, junit = tmp_path / "r.sarif", tmp_path / "r.xml"
    r = run("check", MUT / "jax_flatten_seq.hlo", MUT / "jax_flatten_wrong_gather_dim.hlo",
            "--ranks", "2", "--witness", "--sarif", str(sarif), "--junit", str(junit),
            "--graph", str(tmp_path / "g.dot"))
    assert r.exit_code == 1, r.output
    # no [outputs] in a spec: the witness says it had nothing to compare
    assert "witness: not confirmed numerically" in r.stdout
    assert "no expected relation for out0" in r.stdout
    log = json.loads(sarif.read_text())
    assert log["runs"][0]["results"][0]["ruleId"] == "not-adjacent"
    assert 'failures="1"' in junit.read_text()
    assert (tmp_path / "g.dot").read_text().startswith("digraph")
    ok = run("check", MUT / "jax_flatten_seq.hlo", MUT / "jax_flatten_dist.hlo", "--ranks", "2",
             "--explain", "out0@1")
    assert ok.exit_code == 0, ok.output
    assert "rank 1: out0 =" in ok.stdout and "input relation" in ok.stdout

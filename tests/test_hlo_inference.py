"""HLO pairs with no (or a partial) spec: the rank count from the collectives,
parameters paired by metadata/shapes/uses, segmented splits inferred from the
sequential program, distributed-only inputs ([dist_params]), rank0_only, and
`dlverify spec` (issue 12 items 1, 3 and 4)."""
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dlverify.cli import EXIT_INPUT, EXIT_MISMATCH, EXIT_OK, app
from dlverify.errors import InputError
from dlverify.frontends.hlo import parse_hlo_module
from dlverify.frontends.hlo.pairing import pair_modules
from dlverify.frontends.hlo.param_infer import ranks_from_collectives
from dlverify.hlo_api import hlo_problem, verify_hlo
from dlverify.interpret import Interpreter
from dlverify.ir import IdAllocator
from dlverify.spec import load_spec, parse_spec
from dlverify.spec_writer import infer_spec

DATA = Path(__file__).resolve().parent / "data"
NEURON, MUT, TXLA = DATA / "neuron_llama", DATA / "mutants", DATA / "torch_xla"


def _same_spec(inferred, reference):
    """The relations two specs state (lines and comments aside)."""
    def params(s):
        return {k: (p.kind, p.dim, p.segments, p.dist) for k, p in s.params.items()}

    def outputs(s):
        return {k: (o.kind, o.dim) for k, o in (s.outputs or {}).items()}
    assert inferred.ranks == reference.ranks
    assert params(inferred) == params(reference)
    assert outputs(inferred) == outputs(reference)


@pytest.mark.parametrize("seq, dist, spec", [
    ("tp1_layer1.hlo", "tp2_layer1.hlo", "tp2.toml"),
    ("tp1_layer2.hlo", "tp2_layer2.hlo", "tp2_layer2.toml"),
])
def test_spec_command_reproduces_the_hand_written_neuron_spec(seq, dist, spec, tmp_path):
    got = infer_spec(NEURON / seq, NEURON / dist)
    assert got.verified
    assert "# The pair verifies under this spec." in got.text
    _same_spec(parse_spec(got.text, "inferred.toml"), load_spec(NEURON / spec))
    # one evidence comment per parameter entry
    rows = [line for line in got.text.splitlines() if line[:1].isdigit()]
    assert rows and all("    # " in line for line in rows)
    # what it prints is a spec `dlverify check` accepts and verifies under
    out = tmp_path / "spec.toml"
    out.write_text(got.text)
    assert verify_hlo(NEURON / seq, NEURON / dist, out).verified


@pytest.mark.parametrize("mutant, line", [
    ("tp2_layer1_wrong_slice.hlo", 69),
    ("tp2_layer1_wrong_group.hlo", 133),
    ("tp2_layer1_k_reads_q.hlo", 89),
    ("tp2_layer1_no_allreduce.hlo", 152),
])
def test_neuron_mutants_without_a_spec_are_not_verified_and_located(mutant, line):
    # under inferred relations nothing buggy may verify; the segments are read from
    # the sequential program, so a wrong distributed slice stays a located bug
    res = verify_hlo(NEURON / "tp1_layer1.hlo", MUT / mutant)
    assert not res.verified
    assert (res.failures[0].file, res.failures[0].line) == (str(MUT / mutant), line)
    assert any(a.startswith("parameter 9 ") and "segments [2048, 512, 512]" in a
               for a in res.assumptions)


def test_ranks_from_iota_groups_and_permute_pairs():
    text = """HloModule m

ENTRY %e (a: f32[4]) -> f32[8] {
  %a = f32[4]{0} parameter(0)
  %p = f32[4]{0} collective-permute(%a), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  ROOT %r = f32[8]{0} all-gather(%p), replica_groups=[2,2]<=[4], dimensions={0}
}
"""
    got = ranks_from_collectives(parse_hlo_module(text, "m.hlo"))
    assert got is not None and got.n == 4 and "m.hlo:5" in got.evidence
    none = parse_hlo_module(text.replace("source_target_pairs={{0,1},{1,2},{2,3},{3,0}}",
                                         "source_target_pairs={}")
                            .replace("replica_groups=[2,2]<=[4]", "replica_groups={}"), "n.hlo")
    assert ranks_from_collectives(none) is None


# ---------------------------------------------------------------------------
# torch_xla's conventions (tests/data/torch_xla/README.md)

def test_torch_xla_tp_mlp_pairs_by_shapes_and_uses_and_verifies():
    res = verify_hlo(TXLA / "tp_mlp_seq.hlo", TXLA / "tp_mlp_dist.hlo", TXLA / "tp_mlp.toml")
    assert res.verified
    paired = sorted(a for a in res.assumptions if " paired with distributed parameter " in a)
    assert [p.split(":")[0] for p in paired] == [
        "parameter 0 (p0.1) paired with distributed parameter 2 (p2.3)",
        "parameter 1 (p1.2) paired with distributed parameter 1 (p1.2)",
        "parameter 2 (p2.3) paired with distributed parameter 4 (p4.5)",
        "parameter 3 (p3.4) paired with distributed parameter 0 (p0.1)"]


def test_torch_xla_rank_id_must_be_declared():
    with pytest.raises(InputError) as ei:
        verify_hlo(TXLA / "tp_mlp_seq.hlo", TXLA / "tp_mlp_dist.hlo")
    e = ei.value
    assert e.file.endswith("tp_mlp_dist.hlo") and e.line == 13
    assert "distributed parameter 3 (p3.4 int32[]) has no sequential counterpart" in e.message
    assert '[dist_params] as "rank_id"' in e.message


@pytest.mark.parametrize("dist, line", [
    ("tp_mlp_dist_bias_before_reduce.hlo", 25),   # the bias added on every rank
    ("tp_mlp_dist_wrong_offset.hlo", 24),         # rank * 8 instead of rank * 16
])
def test_torch_xla_tp_mlp_bugs_are_not_verified(dist, line):
    res = verify_hlo(TXLA / "tp_mlp_seq.hlo", TXLA / dist, TXLA / "tp_mlp.toml")
    assert not res.verified
    assert (res.failures[0].file, res.failures[0].line) == (str(TXLA / dist), line)


def test_torch_xla_data_parallel_step_with_a_divisor_parameter(tmp_path):
    ok = verify_hlo(TXLA / "dp_step_seq.hlo", TXLA / "dp_step_dist.hlo", TXLA / "dp_step.toml")
    assert ok.verified
    assert ok.outputs == ["out0 = r0.out0  (replicated on all 2 ranks)",
                          "out1 = r0.out1  (replicated on all 2 ranks)"]
    bad = verify_hlo(TXLA / "dp_step_seq.hlo", TXLA / "dp_step_dist_grad_not_reduced.hlo",
                     TXLA / "dp_step.toml")
    assert not bad.verified
    # a wrong divisor is a wrong average: not verified either
    wrong = tmp_path / "wrong.toml"
    wrong.write_text((TXLA / "dp_step.toml").read_text().replace("{ value = 2 }", "{ value = 4 }"))
    assert not verify_hlo(TXLA / "dp_step_seq.hlo", TXLA / "dp_step_dist.hlo", wrong).verified


def test_rank0_only_is_the_value_on_rank_0_and_zeros_elsewhere(tmp_path):
    spec = tmp_path / "r0.toml"
    spec.write_text('[params]\n3 = "rank0_only"\n[dist_params]\n3 = "rank_id"\n')
    p = hlo_problem(TXLA / "tp_mlp_seq.hlo", TXLA / "tp_mlp_dist_bias_before_reduce.hlo",
                    load_spec(spec), None, IdAllocator())
    rng = np.random.default_rng(0)
    ins = []
    for t, rel in zip(p.dist.inputs, p.inputs):
        full = rng.standard_normal(rel.seq_shape).astype(np.float32)
        ins.append([full[tuple(slice(o, o + s) for o, s in zip(off, rel.dist_shape))]
                    for off in rel.offsets])
    vals = Interpreter(p.dist, 2, lambda r, axis: r).run(ins)
    bias_param = next(op.output for op in p.dist.ops if op.kind == "select_n")
    b = ins[3][0]
    np.testing.assert_array_equal(vals[bias_param][0], b)
    np.testing.assert_array_equal(vals[bias_param][1], np.zeros_like(b))


def test_a_rank0_only_bias_added_before_the_all_reduce_verifies(tmp_path):
    # each rank adds its bias input to its partial sum, then the all-reduce: right when
    # rank 0 is passed the bias and the others zeros (partials.dl, a value held with
    # term 0), wrong when every rank is passed the bias
    spec = tmp_path / "r0.toml"
    spec.write_text('[params]\n3 = "rank0_only"\n[dist_params]\n3 = "rank_id"\n')
    dist = TXLA / "tp_mlp_dist_bias_before_reduce.hlo"
    res = verify_hlo(TXLA / "tp_mlp_seq.hlo", dist, spec)
    assert res.verified, [f.message for f in res.failures[:3]]
    assert not verify_hlo(TXLA / "tp_mlp_seq.hlo", dist, TXLA / "tp_mlp.toml").verified


def test_spec_parse_errors_name_the_line():
    with pytest.raises(InputError) as ei:
        parse_spec("[params]\n0 = { split = 1, dist = 3 }\n1 = { replicated = true, dist = 3 }\n",
                   "s.toml")
    assert ei.value.line in (2, 3) and "named by two [params] entries" in ei.value.message
    with pytest.raises(InputError) as ei:
        parse_spec("[dist_params]\n\n2 = { value = \"x\" }\n", "s.toml")
    assert ei.value.line == 3 and "rank_id" in ei.value.message
    with pytest.raises(InputError) as ei:
        parse_spec("[params]\n0 = { replicated = false }\n", "s.toml")
    assert ei.value.line == 2


def test_dist_params_must_exist_and_fit():
    seq, dist = TXLA / "tp_mlp_seq.hlo", TXLA / "tp_mlp_dist.hlo"
    s, d = parse_hlo_module(seq.read_text(), str(seq)), parse_hlo_module(dist.read_text(), str(dist))
    with pytest.raises(InputError, match="names parameter 9"):
        pair_modules(s, d, IdAllocator(), spec=parse_spec("[dist_params]\n9 = \"rank_id\"\n", "x.toml"))
    with pytest.raises(InputError, match="not an integer scalar") as ei:
        pair_modules(s, d, IdAllocator(), spec=parse_spec(
            "[params]\n0 = { replicated = true, dist = 2 }\n[dist_params]\n3 = \"rank_id\"\n"
            "0 = \"rank_id\"\n", "x.toml"))
    assert ei.value.line == 5


def test_spec_cli_exit_codes(tmp_path):
    runner = CliRunner()
    out = tmp_path / "s.toml"
    r = runner.invoke(app, ["spec", str(TXLA / "dp_step_seq.hlo"), str(TXLA / "dp_step_dist.hlo"),
                            "--spec", str(TXLA / "dp_step.toml"), "-o", str(out)])
    assert r.exit_code == EXIT_OK, r.output
    text = out.read_text()
    assert "0 = { value = 2.0 }    # stated by the input spec" in text
    assert '1 = "replicated"' in text   # the averaged gradient
    r = runner.invoke(app, ["spec", str(TXLA / "dp_step_seq.hlo"),
                            str(TXLA / "dp_step_dist_grad_not_reduced.hlo"),
                            "--spec", str(TXLA / "dp_step.toml")])
    assert r.exit_code == EXIT_MISMATCH and "NOT verified under this spec" in r.output
    r = runner.invoke(app, ["spec", str(TXLA / "dp_step_seq.hlo"), str(tmp_path / "no.hlo")])
    assert r.exit_code == EXIT_INPUT


def test_outputs_averaged_outside_the_module(tmp_path):
    # the data-parallel step with no collective: the wrapper averages the ranks'
    # loss and gradient; "mean" outputs are stated as an appended all-reduce / N
    seq, dist = TXLA / "dp_step_seq.hlo", TXLA / "dp_step_dist_local.hlo"
    ok = verify_hlo(seq, dist, TXLA / "dp_step_local.toml")
    assert ok.verified
    assert any(a.startswith('output 1: the mean over the 2 ranks') for a in ok.assumptions)
    summed = tmp_path / "sum.toml"
    summed.write_text((TXLA / "dp_step_local.toml").read_text().replace('1 = "mean"', '1 = "sum"'))
    bad = verify_hlo(seq, dist, summed)
    assert not bad.verified and "scale differs by 2" in bad.failures[0].message
    # `dlverify spec` keeps the stated reductions
    text = infer_spec(seq, dist, TXLA / "dp_step_local.toml").text
    assert '1 = "mean"    # stated by the input spec' in text
    with pytest.raises(InputError) as ei:
        parse_spec('[outputs]\n0 = "median"\n', "s.toml")
    assert ei.value.line == 2 and '"mean"' in ei.value.message

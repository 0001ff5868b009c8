"""verdict.dl: Output_Ok (what counts as a proved output) and the frontiers
(Seq_Frontier, Dist_Frontier: where derivation stops), through the Result and
through the raw relations."""
from rulekit import Tiny

from dlverify import schema as S
from dlverify.api import rules_path
from dlverify.engine import run_program
from dlverify.facts import export
from dlverify.passes import fold, share_nullary

DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def raw(t: Tiny) -> dict[str, set[tuple]]:
    """The verdict relations of the real rule program on t's facts."""
    p = t.problem()
    share_nullary(p.seq)
    share_nullary(p.dist)
    tables, _ = export(p, fold(p.seq, None), fold(p.dist, p.mesh))
    res = run_program(rules_path(), tables, S.OUTPUTS, engine="clingo")
    return {name: set(rows) for name, rows in res.relations.items()}


def dfull(t, value, shape):
    return t.dop("broadcast_in_dim", [t.dconst(value)], shape, broadcast_dimensions=())


def matmul_terms(t):
    xs, xd = t.input((4, 6), (None, "x"))
    ws, wd = t.input((6, 3), ("x", None))
    ys = t.sop("dot_general", [xs, ws], (4, 3), **DOT)
    yd = t.dop("dot_general", [xd, wd], (4, 3), **DOT)
    return ys, yd


# ---------------------------------------------------------------- Output_Ok

def test_complete_unit_views_matching_the_expected_blocks_verify():
    t = Tiny()
    xs, xd = t.input((4, 3), ("x", None))
    es = t.sop("exp", [xs], (4, 3))
    ed = t.dop("exp", [xd], (2, 3))
    gd = t.dop("all_gather", [ed], (4, 3), dimension=0, groups=[[0, 1]])
    t.output(es, ed, ("x", None))
    t.output(es, gd, ())
    out = t.run()
    assert out.result.verified and out.result.failures == []
    assert out.result.outputs == ["out0 = concat(r0.out0, r1.out0; dim 0)",
                                  "out1 = r0.out1  (replicated on all 2 ranks)"]
    assert raw(t)["Output_Ok"] == {(es, ed, 0), (es, ed, 1), (es, gd, 0), (es, gd, 1)}


def test_a_wildcard_offset_matches_the_expected_block():
    # the dist broadcast is (-1, 0) of the seq broadcast: any row block, so also rows 2r:2r+2
    t = Tiny()
    bs, bd = t.input((3,))
    ss = t.sop("broadcast_in_dim", [bs], (4, 3), broadcast_dimensions=(1,))
    sd = t.dop("broadcast_in_dim", [bd], (2, 3), broadcast_dimensions=(1,))
    t.output(ss, sd, ("x", None))
    out = t.run()
    assert {v.offsets for v in out.views(ss, sd)} == {(-1, 0)}
    assert out.result.verified
    assert raw(t)["Output_Ok"] == {(ss, sd, 0), (ss, sd, 1)}


def test_a_block_other_than_the_expected_one_is_not_ok():
    # every rank returns rows 0:2: right on rank 0, wrong on rank 1
    t = Tiny()
    xs, xd = t.input((4, 3))
    top = t.dop("slice", [xd], (2, 3), start_indices=(0, 0), limit_indices=(2, 3), strides=None)
    t.output(xs, top, ("x", None))
    out = t.run()
    assert raw(t)["Output_Ok"] == {(xs, top, 0)}
    assert not out.result.verified
    assert out.result.outputs == ["out0: not proved on ranks [1]"]
    (f,) = out.result.failures
    assert f.message == ("out0 on rank 1 holds [0:2, 0:3] of the sequential output but the "
                         "output relation requires [2:4, 0:3]")
    assert f.ranks == (1,)


def test_swapped_blocks_fail_on_every_rank():
    t = Tiny()
    xs, xd = t.input((4, 3), ("x", None))
    sw = t.dop("collective_permute", [xd], (2, 3), pairs=[(0, 1), (1, 0)])
    t.output(xs, sw, ("x", None))
    out = t.run()
    assert raw(t)["Output_Ok"] == set()
    (f,) = out.result.failures
    assert f.op == "collective_permute"
    assert f.message.startswith("out0 on rank 0 holds [2:4, 0:3] of the sequential output but "
                                "the output relation requires [0:2, 0:3]")
    assert f.message.endswith("(ranks [0, 1] fail)")


def test_a_partial_output_is_not_ok():
    t = Tiny()
    ys, yd = matmul_terms(t)
    t.output(ys, yd)
    out = t.run()
    assert all(v.partial is not None for v in out.views(ys, yd))
    assert raw(t)["Output_Ok"] == set()
    assert not out.result.verified
    msgs = [f.message for f in out.result.failures]
    assert any(m.startswith("out0 on rank 0 is a partial sum that is never reduced") for m in msgs)
    assert out.result.failures[-1].op == "dot_general"    # located at the op that made the term


def test_a_scaled_output_is_not_ok():
    t = Tiny()
    xs, xd = t.input((4, 3), ("x", None))
    x2 = t.dop("mul", [xd, dfull(t, 2.0, (2, 3))], (2, 3))
    t.output(xs, x2, ("x", None))
    out = t.run()
    assert {v.scale for v in out.views(xs, x2)} == {(1, 0, 0, 0)}
    assert raw(t)["Output_Ok"] == set()
    (f,) = out.result.failures
    assert f.op == "mul"
    assert f.message == ("out0 on rank 0 is 2 times the sequential value: scale differs by 2 "
                         "(the factor enters at mul) (ranks [0, 1] fail)")


def test_an_output_without_an_expected_relation_is_inferred_and_listed():
    """Without an expected relation, the one the views tile is inferred, stated as an
    assumption; Output_Ok itself needs an expected relation."""
    t = Tiny()
    xs, xd = t.input((4, 3), ("x", None))
    t.output(xs, xd, None)
    out = t.run()
    assert out.result.verified
    assert raw(t)["Output_Ok"] == set()
    assert out.result.outputs == ["out0 = concat(r0.out0, r1.out0; dim 0)"]
    assert out.result.assumptions == ["output relation inferred: out0 = concat(r0.out0, r1.out0; dim 0)"]


def test_an_output_whose_views_do_not_tile_it_is_not_verified():
    t = Tiny()
    xs, xd = t.input((4, 3), ("x", None))
    ys = t.sop("reduce_sum", [xs], (3,), axes=(0,))
    yd = t.dop("reduce_sum", [xd], (3,), axes=(0,))   # partial sums, never reduced
    t.output(ys, yd, None)
    out = t.run()
    assert not out.result.verified
    assert not out.result.assumptions
    assert out.result.failures


# ---------------------------------------------------------------- frontiers

def test_frontiers_name_the_first_op_whose_operands_have_views():
    t = Tiny()
    ys, yd = matmul_terms(t)
    bs, bd = t.input((4, 3))
    es = t.sop("exp", [ys], (4, 3))                  # seq: exp of the full sum
    ed = t.dop("exp", [yd], (4, 3))                  # dist: exp of a partial term (the bug)
    exp_s, exp_d = t.seq.ops[-1].id, t.dist.ops[-1].id
    ms = t.sop("mul", [es, bs], (4, 3))
    md = t.dop("mul", [ed, bd], (4, 3))              # operand 0 has no view: not a frontier
    rd = t.dop("all_reduce", [md], (4, 3), reducer="sum", groups=[[0, 1]])
    t.output(ms, rd)
    out = t.run()
    rel = raw(t)
    assert rel["Dist_Frontier"] == {(exp_d, 0), (exp_d, 1)}
    assert rel["Seq_Frontier"] == {(exp_s,)}
    f_dist, f_seq = out.result.failures[0], out.result.failures[-1]
    assert (f_dist.op, f_dist.program, f_dist.ranks) == ("exp", "distributed", (0, 1))
    assert f_dist.reason == "nonlinear op applied to a partial sum: reduce first"
    # the sequential exp reads a value the distributed program holds only as partial
    # sums: a consequence of the distributed failure, listed last (after the output's)
    assert (f_seq.op, f_seq.program) == ("exp", "sequential")
    assert "held only as partial sums" in f_seq.message
    assert [f.program for f in out.result.failures].count("sequential") == 1
    assert "operand 0 on rank 0: partial sum (range [0:3)" in f_dist.message


def test_an_op_with_an_unrelated_operand_is_not_a_frontier():
    t = Tiny()
    xs, xd = t.input((4, 3), ("x", None))
    zs, zd = t.input((4, 3), ("x", None))
    swapped = t.dop("collective_permute", [zd], (2, 3), pairs=[(0, 1)])   # rank 0 gets nothing
    as_ = t.sop("add", [xs, zs], (4, 3))
    ad = t.dop("add", [xd, swapped], (2, 3))
    add_s, add_d = t.seq.ops[-1].id, t.dist.ops[-1].id
    es = t.sop("exp", [as_], (4, 3))
    ed = t.dop("exp", [ad], (2, 3))
    t.output(es, ed, ("x", None))
    rel = raw(t)
    # rank 1: rows 0:2 of z added to rows 2:4 of x -> the add is the frontier there;
    # rank 0 receives nothing: zeros (halo.dl), x + 0 relates to x but not to x + z,
    # so the add is the frontier there too, not the permute
    assert (add_d, 1) in rel["Dist_Frontier"]
    assert (add_d, 0) in rel["Dist_Frontier"]
    permute = next(op.id for op in t.dist.ops if op.kind == "collective_permute")
    assert (permute, 0) not in rel["Dist_Frontier"]
    assert all(op != t.dist.ops[-1].id for op, _ in rel["Dist_Frontier"])   # exp: inputs missing
    # the seq add: both operands have views, its output none
    assert rel["Seq_Frontier"] == {(add_s,)}

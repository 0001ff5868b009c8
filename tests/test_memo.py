"""Memoised segments (dlverify/memo.py) and the repeated-block finder
(dlverify/structure.py): equal segments up to renaming share one engine run, a
segment that differs in one fact does not, and the verdict and the views are
those of one fixpoint."""
import sys

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify
from conftest import ROOT
from dlverify import schema as S
from dlverify.api import verify_problem
from dlverify.frontends.jaxpr import import_jax
from dlverify.memo import canonicalise, offsets_record, views_back
from dlverify.structure import find_repetition

sys.path.insert(0, str(ROOT / "examples" / "models"))
import llama3  # noqa: E402


def _chain(depth: int, bad_at: int | None = None):
    def f(x):
        for i in range(depth):
            x = jnp.exp(x) if i == bad_at else jnp.tanh(x) * 2.0
        return x
    return f


def _chain_problem(depth: int, bad_at: int | None = None):
    mesh = dlverify.host_mesh((2,), ("x",))
    dist_fn = _chain(depth, bad_at)
    dist = jax.jit(jax.shard_map(dist_fn, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    args = (jax.ShapeDtypeStruct((8, 4), jnp.float32),)
    return import_jax(_chain(depth), dist, args, name="chain")


# ---------------------------------------------------------------- canonical keys

def _window(base: int, sig: int):
    """A two-op window (tanh of a seeded tensor in both programs) with ids from `base`."""
    s_in, s_out, d_in, d_out, s_op, d_op = (base + k for k in range(6))
    tables = {
        S.SEQ_TENSOR: [(s_in,), (s_out,)], S.DIST_TENSOR: [(d_in,), (d_out,)],
        S.TENSOR_RANK: [(t, 1) for t in (s_in, s_out, d_in, d_out)],
        S.TENSOR_DIM: [(s_in, 0, 8), (s_out, 0, 8), (d_in, 0, 4), (d_out, 0, 4)],
        S.OP_INPUT: [(s_op, 0, s_in), (d_op, 0, d_in)],
        S.OP_OUTPUT: [(s_op, s_out), (d_op, d_out)],
        S.ELEM_UNARY: [(s_op,), (d_op,)],
        S.OP_SIG: [(s_op, sig), (d_op, sig)],
        S.RANK_COUNT: [(2,)],
    }
    seeds = {(s_in, d_in, r, offsets_record((4 * r,)), None, (0, 0, 0, 0)) for r in range(2)}
    order = [s_op, s_in, s_out, d_op, d_in, d_out]
    return order, tables, seeds


def test_equal_windows_up_to_renaming_have_one_key():
    a = canonicalise(*_window(100, sig=7))
    b = canonicalise(*_window(5000, sig=3))  # other ids, other interned signature
    assert a.key == b.key
    assert a.tables == b.tables


def test_a_window_that_differs_in_one_fact_has_another_key():
    order, tables, seeds = _window(100, sig=7)
    base = canonicalise(order, tables, seeds)
    tables2 = {**tables, S.TENSOR_DIM: [(100, 0, 8), (101, 0, 8), (102, 0, 4), (103, 0, 2)]}
    assert canonicalise(order, tables2, seeds).key != base.key
    seeds2 = {(100, 102, 0, offsets_record((0,)), None, (0, 0, 0, 0))}
    assert canonicalise(order, tables, seeds2).key != base.key
    tables3 = {**tables, S.OP_SIG: [(104, 7), (105, 8)]}  # the ops no longer pair
    assert canonicalise(order, tables3, seeds).key != base.key


def test_views_are_renamed_back_to_the_windows_own_ids():
    order, tables, seeds = _window(100, sig=7)
    canon = canonicalise(order, tables, seeds)
    fwd = {orig: k for k, orig in enumerate(canon.back) if k}
    row = (fwd[101], fwd[103], 1, offsets_record((4,)), (0, fwd[104], 0, 0, 4), (0, 0, 0, 0))
    assert views_back(canon, [row]) == [(101, 103, 1, offsets_record((4,)), (0, 104, 0, 0, 4),
                                         (0, 0, 0, 0))]


def test_fast_seed_rows_are_schema_seed_rows():
    from dlverify.memo import _seed_row

    for tag in (None, (0, 41, 2, 0, 64)):
        t = (-1, 0, 0, 0, 0) if tag is None else tag
        assert _seed_row((3, 10, 11, 5, *t, 1, 0, -2, 0)) == S.seed_row(3, 10, 11, 5, tag, (1, 0, -2, 0))


def _sig_zero():
    """Sig_Zero(g): ops of signature g map zeros to zero (a row about Op_Sig's numbering)."""
    return S.BY_NAME.get("Sig_Zero") or S.Relation("Sig_Zero", (S.Column("g", "number"),), "")


def test_rows_about_a_signature_are_renamed_with_it():
    """Op_Sig's signatures are renamed; a Sig_Zero row must be renamed alike, or a
    window whose op has signature 3 and a Sig_Zero row of signature 7 (another op
    kind) would share the key, and the views, of a window whose op maps zeros to zero."""
    zero = _sig_zero()
    order, tables, seeds = _window(100, sig=7)
    own = canonicalise(order, {**tables, zero: [(7,)]}, seeds)
    assert {g for (g,) in own.tables[zero]} == {g for _, g in own.tables[S.OP_SIG]}
    order_b, tables_b, seeds_b = _window(5000, sig=3)
    other = canonicalise(order_b, {**tables_b, zero: [(7,)]}, seeds_b)
    assert other.key != own.key
    assert not {g for (g,) in other.tables[zero]} & {g for _, g in other.tables[S.OP_SIG]}
    assert canonicalise(order_b, {**tables_b, zero: [(3,)]}, seeds_b).key == own.key


def test_rows_about_a_signature_travel_with_the_ops_of_that_signature():
    from dlverify.segments import _Index, _window_tables

    zero = _sig_zero()
    order, tables, seeds = _window(100, sig=7)
    index = _Index({**tables, S.OP_SIG: tables[S.OP_SIG] + [(900, 8)], zero: [(7,), (8,)]})
    wt = _window_tables(index, order, seeds)
    assert wt[zero] == [(7,)]  # the window's ops have signature 7 only


def test_rows_about_a_value_travel_with_the_tensors_holding_it():
    """Any relation about an interned value (its first column a ValueId, no op or
    tensor column) is placed by that value, not only the ones known when written."""
    from dlverify.segments import _Index, _window_tables

    about = S.BY_NAME.get("Value_Identity") or S.Relation(
        "Value_Identity", (S.Column("v", "ValueId"), S.Column("red", "number")), "")
    order, tables, seeds = _window(100, sig=7)
    tables = {**tables, S.SEQ_SPLAT: [(101, 1), (900, 2)], about: [(1, 0), (2, 0)]}
    wt = _window_tables(_Index(tables), order, seeds)
    assert wt[about] == [(1, 0)]  # the window's tensor 101 holds value 1 only


# ---------------------------------------------------------------- repeated blocks

def test_repeated_blocks_of_a_chain_and_of_a_model():
    chain = _chain_problem(40)
    rep = find_repetition(chain.dist)
    assert rep is not None and rep.count >= 30
    cfg = llama3.SMALL._replace(layers=6)
    case = llama3.make_case(2, sp=True, train=False, cfg=cfg)
    problem = import_jax(case.seq, case.dist, case.args, name="llama6")
    for g in (problem.seq, problem.dist):
        rep = find_repetition(g)
        assert rep is not None
        assert rep.count >= 4, rep  # 6 layers: the first and last differ in their neighbours
        layer_ops = rep.period
        assert layer_ops * cfg.layers < len(g.ops) < layer_ops * (cfg.layers + 3)


# ---------------------------------------------------------------- end to end

def test_memo_hits_give_the_views_and_verdict_of_one_fixpoint():
    whole = verify_problem(_chain_problem(120), engine="clingo", window=10**6)
    seg = verify_problem(_chain_problem(120), engine="clingo", window=24)
    plan = seg.segment_plan
    assert plan is not None and plan.memo_hits > 0
    assert plan.engine_runs < len(plan.segments) / 2
    assert seg.verified and whole.verified
    assert set(seg.views) <= set(whole.views)
    assert seg.outputs == whole.outputs


def test_memo_does_not_hide_a_block_that_differs():
    res = verify_problem(_chain_problem(100, bad_at=75), engine="clingo", window=24)
    assert not res.verified
    assert res.failures[0].op == "exp"


def test_on_disk_cache_reuses_every_segment(tmp_path):
    first = verify_problem(_chain_problem(120), engine="clingo", window=24, cache_dir=tmp_path)
    again = verify_problem(_chain_problem(120), engine="clingo", window=24, cache_dir=tmp_path)
    assert first.verified and again.verified
    assert first.segment_plan.engine_runs > 0
    assert again.segment_plan.engine_runs == 0
    assert again.segment_plan.cache_hits > 0
    assert set(again.views) == set(first.views)

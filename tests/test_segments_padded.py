"""Padded views carried between segments (dlverify/segments.py, Pad_Seed in
datalog/padded.dl): a deep chain over a dim the rank count does not divide is
verified segment by segment, not retried as one fixpoint; its padded views hold
numerically; a twin that sums the padding is not verified and is located; padded
seeds that differ only in their padding value never share a memo entry."""
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P
from rulekit import assert_views_hold
from test_memo import _window as tanh_window

import dlverify
from dlverify import schema as S
from dlverify.api import jax_problem, problem_tables, rules_path, verify_jax
from dlverify.engine import run_program
from dlverify.memo import (Derived, Memo, canonicalise, offsets_record, pad_seed_views,
                           pad_views_back)
from dlverify.segments import run_segmented

LAYERS, WINDOW = 12, 8
RETRY_NOTE = "then evaluated as one fixpoint"


def _chain(x, ws):
    for w in ws:
        x = jnp.tanh(x @ w)
    return x


def _args(rows: int, width: int):
    return ((jax.ShapeDtypeStruct((rows, width), jnp.float32),)
            + tuple(jax.ShapeDtypeStruct((width, width), jnp.float32) for _ in range(LAYERS)))


def _segmented(res) -> int:
    """How many segments the verdict came from; fails if it was retried as one fixpoint."""
    assert not [n for n in res.notes if RETRY_NOTE in n], res.notes
    assert res.segment_plan is not None
    return len(res.segment_plan.segments)


# ---------------------------------------------------------------- XLA's partitioner

def test_a_deep_chain_over_an_uneven_dim_verifies_in_segments():
    """10 rows over 4 devices (blocks of 3, the last one padded), the reproduction of
    issue 10: every layer's block crosses segment boundaries as a padded view."""
    mesh = dlverify.host_mesh((4,), ("x",))

    def f(x, *ws, constrain=False):
        if constrain:
            x = jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P("x")))
        return jnp.sum(_chain(x, ws), axis=0)
    jitted = jax.jit(lambda *a: f(*a, constrain=True),
                     in_shardings=tuple(NamedSharding(mesh, P()) for _ in range(LAYERS + 1)))
    res = verify_jax(f, jitted, *_args(10, 4), window=WINDOW)
    assert res.verified, res.failures
    assert _segmented(res) >= 3
    # the last device's blocks are padded in every layer, carried from segment to segment
    last = {v.dist for v in res.padded_views if v.rank == 3 and v.padding == 0.0}
    assert len(last) >= LAYERS
    assert_views_hold(res.problem, res.views, padded=res.padded_views)


# ---------------------------------------------------------------- written by hand

def _by_hand(mask: bool):
    """The partitioner's program written out: pad to 12 rows, take rank r's 3 rows,
    the chain, exp (1 at the padding), the padding masked to 0 before the sum."""
    mesh = dlverify.host_mesh((4,), ("x",))

    def seq(x, *ws):
        return jnp.sum(jnp.exp(_chain(x, ws)), axis=0)

    def dist(x, *ws):
        r = jax.lax.axis_index("x")
        h = jax.lax.dynamic_slice_in_dim(jnp.pad(x, ((0, 2), (0, 0))), r * 3, 3, axis=0)
        e = jnp.exp(_chain(h, ws))
        if mask:
            e = jnp.where(jnp.arange(3)[:, None] + r * 3 < 10, e, 0.0)
        return jax.lax.psum(jnp.sum(e, axis=0), "x")  # the sum of the padding
    d = jax.jit(jax.shard_map(dist, mesh=mesh, in_specs=(P(),) * (LAYERS + 1), out_specs=P()))
    return seq, d, _args(10, 4)


def test_a_masked_padded_chain_written_by_hand_verifies_in_segments():
    seq, d, args = _by_hand(mask=True)
    res = verify_jax(seq, d, *args, window=WINDOW)
    assert res.verified, res.failures
    assert _segmented(res) >= 3
    assert {v.padding for v in res.padded_views if v.rank == 3} >= {0.0, None}
    assert_views_hold(res.problem, res.views, padded=res.padded_views)


def _sum_line() -> int:
    return next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if "# the sum of the padding" in text)


def test_summing_the_padding_is_not_verified_and_is_located():
    seq, d, args = _by_hand(mask=False)
    res = verify_jax(seq, d, *args, window=WINDOW)
    assert not res.verified
    assert any(f.line == _sum_line() and "padded past its end" in f.message for f in res.failures)


def test_the_segmented_frontier_stops_at_the_sum_of_the_padding():
    """The segments' own diagnosis (no one-fixpoint retry): the reduction reading the
    padded block on the last rank is the frontier there, as datalog/verdict.dl says."""
    seq, d, args = _by_hand(mask=False)
    problem, _ = jax_problem(seq, d, *args)
    run = run_segmented(problem, problem_tables(problem), rules_path(), "auto", WINDOW)
    assert run.relations[S.PAD_VIEW.name]
    sums = {op.id for op in problem.dist.ops if op.kind == "reduce_sum"}
    front = {(op, r) for op, r in run.relations[S.DIST_FRONTIER.name]}
    assert {(op, 3) for op in sums} & front
    assert not {(op, r) for op in sums for r in range(3)} & front


# ---------------------------------------------------------------- memo keys and the rule

def _window(base: int, z: int):
    """test_memo's tanh window with a padded seed: rank 0 holds rows 0..3 of 6, rank 1
    rows 4..7 (2 past the end)."""
    order, tables, _ = tanh_window(base, sig=7)
    s_in, s_out, d_in, d_out = (base + k for k in range(4))
    tables[S.TENSOR_DIM] = [(s_in, 0, 6), (s_out, 0, 6), (d_in, 0, 4), (d_out, 0, 4)]
    return order, tables, {(s_in, d_in, r, offsets_record((4 * r,)), z) for r in range(2)}


def test_padded_seeds_differing_only_in_their_padding_value_have_other_keys(tmp_path):
    order, tables, pads = _window(100, z=1)
    zero = canonicalise(order, tables, set(), pads)
    assert canonicalise(*_window(5000, z=1)[:2], set(), _window(5000, z=1)[2]).key == zero.key
    unknown = canonicalise(order, tables, set(), _window(100, z=0)[2])
    assert unknown.key != zero.key
    assert canonicalise(order, tables, set()).key != zero.key
    assert set(pad_views_back(zero, pad_seed_views(zero.tables))) == pads  # the seeds, read back
    memo = Memo(rules_path(), "clingo", tmp_path)
    got = Derived([], [(1, 2, 0, offsets_record((4, 0)), 1)])
    memo.put(zero.key, got)
    assert memo.get(unknown.key) is None
    assert Memo(rules_path(), "clingo", tmp_path).get(zero.key) == got  # read back from disk


@pytest.mark.parametrize("engine", ["clingo", "souffle"])
def test_padded_seeds_become_padded_views_on_both_engines(engine):
    order, tables, pads = _window(100, z=1)
    canon = canonicalise(order, tables, set(), pads)
    res = run_program(rules_path(), canon.tables, [S.VIEW, S.PAD_VIEW], engine=engine)
    got = set(pad_views_back(canon, [tuple(r) for r in res.relations[S.PAD_VIEW.name]]))
    assert pads <= got  # the seeds themselves
    assert (100, 102, 1, offsets_record((4,)), 0) in got  # known padding is padding
    views = {(canon.back[r[0]], canon.back[r[1]], r[2]) for r in res.relations[S.VIEW.name]}
    assert (100, 102, 0) in views and (100, 102, 1) not in views  # rank 0's block lies inside

"""partials.dl: sums of terms of two different reductions, and dot_general over
two partially held contracted dims (fewer KV heads than ranks).

Every view a tiny program derives is checked numerically (rulekit), including
the sums of tiling partial terms; each family has a buggy JAX twin that must
not verify, with its first failure at the `# BUG` line."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bug_line
from jax.sharding import Mesh as JMesh, PartitionSpec as P
from rulekit import Tiny

from dlverify.api import verify_jax
from dlverify.ir import Mesh
from dlverify.partial_tags import ACC_BASE, ADD_BASE, FLAT_BASE, HELD_BASE, prod_axis, trans_axis
from dlverify.verdict import Partial

UNIT = (0, 0, 0, 0)
DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def vset(out, s, d, r):
    return {(v.offsets, v.partial, v.scale) for v in out.views(s, d, r)}


def last_seq_op(t):
    return t.seq.ops[-1].id


# ---------------------------------------------------------------- add of two reductions

def two_reductions_of_x(t: Tiny) -> tuple[tuple[int, int], tuple[int, int]]:
    """x @ a and x @ b with x's 6 columns split over "x": two reductions over the same
    ranges of terms. Each is returned as Tiny returns a tensor: (sequential id, distributed id)."""
    xs, xd = t.input((4, 6), (None, "x"))
    as_, ad = t.input((6, 5), ("x", None))
    bs, bd = t.input((6, 5), ("x", None))
    y1 = (t.sop("dot_general", [xs, as_], (4, 5), **DOT),
          t.dop("dot_general", [xd, ad], (4, 5), **DOT))
    y2 = (t.sop("dot_general", [xs, bs], (4, 5), **DOT),
          t.dop("dot_general", [xd, bd], (4, 5), **DOT))
    return y1, y2


def test_add_of_two_reductions_with_the_same_ranges_is_one_family_that_psum_completes():
    t = Tiny()
    (y1s, y1d), (y2s, y2d) = two_reductions_of_x(t)
    zs = t.sop("sub", [y1s, y2s], (4, 5))
    zd = t.dop("sub", [y1d, y2d], (4, 5))
    sub = last_seq_op(t)
    sd = t.dop("all_reduce", [zd], (4, 5), reducer="sum", groups=[[0, 1]])
    out = t.run()
    for r in range(2):
        assert vset(out, zs, zd, r) == {((0, 0), Partial(0, sub, ADD_BASE, 3 * r, 3 * r + 3), UNIT)}
        assert vset(out, zs, sd, r) == {((0, 0), None, UNIT)}


def reductions_of_6_and_4_terms(t: Tiny) -> tuple[tuple[int, int], tuple[int, int]]:
    """x @ a over 6 terms and w @ b over 4, both split over "x" (3 and 2 terms a rank)."""
    xs, xd = t.input((4, 6), (None, "x"))
    as_, ad = t.input((6, 5), ("x", None))
    ws, wd = t.input((4, 4), (None, "x"))
    bs, bd = t.input((4, 5), ("x", None))
    y1 = (t.sop("dot_general", [xs, as_], (4, 5), **DOT), t.dop("dot_general", [xd, ad], (4, 5), **DOT))
    y2 = (t.sop("dot_general", [ws, bs], (4, 5), **DOT), t.dop("dot_general", [wd, bd], (4, 5), **DOT))
    return y1, y2


@pytest.mark.parametrize("kind", ["add", "sub"])
def test_add_of_two_reductions_of_other_sizes_sums_blocks_of_gcd_many_terms_that_psum_completes(kind):
    """6 and 4 terms: gcd 2 blocks, of 3 and of 2 terms; rank r holds block r of each
    (Megatron's parallel residual: attention and MLP partials psum'ed together)."""
    t = Tiny()
    (y1s, y1d), (y2s, y2d) = reductions_of_6_and_4_terms(t)
    zs = t.sop(kind, [y1s, y2s], (4, 5))
    zd = t.dop(kind, [y1d, y2d], (4, 5))
    op = last_seq_op(t)
    t.dop("exp", [zd], (4, 5))   # read twice: the psum below is not split (collective_sums.py)
    sd = t.dop("all_reduce", [zd], (4, 5), reducer="sum", groups=[[0, 1]])
    out = t.run()
    for r in range(2):
        assert vset(out, zs, zd, r) == {((0, 0), Partial(0, op, ADD_BASE, r, r + 1), UNIT)}
        assert vset(out, zs, sd, r) == {((0, 0), None, UNIT)}


def test_add_of_two_reductions_whose_blocks_differ_has_no_view():
    """The same sizes, but operand 1's terms moved to the other rank first (ppermute):
    rank r holds block r of one family and block 1 - r of the other."""
    t = Tiny()
    (y1s, y1d), (y2s, y2d) = reductions_of_6_and_4_terms(t)
    moved = t.dop("collective_permute", [y2d], (4, 5), pairs=[(0, 1), (1, 0)])
    zs = t.sop("add", [y1s, y2s], (4, 5))
    zd = t.dop("add", [y1d, moved], (4, 5))
    sd = t.dop("all_reduce", [zd], (4, 5), reducer="sum", groups=[[0, 1]])
    out = t.run()
    assert out.views(zs, zd) == [] and out.views(zs, sd) == []


def test_add_of_two_reductions_whose_ranges_cut_a_block_has_no_view():
    """4 and 6 terms (gcd 2: blocks of 2 and 3) with the 4-term family split over
    4 ranks as 1 term each: rank 0's term [0:1) is no whole block, so no view."""
    t = Tiny(mesh=Mesh(("x",), (4,)))
    xs, xd = t.input((3, 4), (None, "x"))
    as_, ad = t.input((4, 5), ("x", None))
    ws, wd = t.input((3, 8), (None, "x"))
    bs, bd = t.input((8, 5), ("x", None))
    y1s = t.sop("dot_general", [xs, as_], (3, 5), **DOT)
    y1d = t.dop("dot_general", [xd, ad], (3, 5), **DOT)
    y2s = t.sop("dot_general", [ws, bs], (3, 5), **DOT)   # 8 terms: gcd(4, 8) = 4, aligned
    y2d = t.dop("dot_general", [wd, bd], (3, 5), **DOT)
    zs = t.sop("add", [y1s, y2s], (3, 5))
    zd = t.dop("add", [y1d, y2d], (3, 5))
    op = last_seq_op(t)
    out = t.run()
    assert {v.partial for v in out.views(zs, zd)} == {
        Partial(0, op, ADD_BASE, r, r + 1) for r in range(4)}
    t = Tiny(mesh=Mesh(("x",), (4,)))
    xs, xd = t.input((3, 4), (None, "x"))
    as_, ad = t.input((4, 5), ("x", None))
    ws, wd = t.input((3, 6), (None, None))   # 6 terms, held whole: [0:6) on every rank
    bs, bd = t.input((6, 5), (None, None))
    y1s = t.sop("dot_general", [xs, as_], (3, 5), **DOT)
    y1d = t.dop("dot_general", [xd, ad], (3, 5), **DOT)
    y2s = t.sop("dot_general", [ws, bs], (3, 5), **DOT)
    y2op = last_seq_op(t)
    zs = t.sop("add", [y1s, y2s], (3, 5))
    # a distributed partial of y2 over terms [0:3) only, on every rank (a slice of the rows)
    w3 = t.dop("slice", [wd], (3, 3), start_indices=(0, 0), limit_indices=(3, 3), strides=None)
    b3 = t.dop("slice", [bd], (3, 5), start_indices=(0, 0), limit_indices=(3, 5), strides=None)
    y2d = t.dop("dot_general", [w3, b3], (3, 5), **DOT)
    zd = t.dop("add", [y1d, y2d], (3, 5))
    out = t.run()
    assert {v.partial for v in out.views(y2s, y2d)} == {Partial(0, y2op, 0, 0, 3)}
    assert out.views(zs, zd) == []


def test_add_of_a_reduced_value_and_a_term_has_no_view():
    t = Tiny()
    (y1s, y1d), (y2s, y2d) = two_reductions_of_x(t)
    c1d = t.dop("all_reduce", [y1d], (4, 5), reducer="sum", groups=[[0, 1]])
    zs = t.sop("add", [y1s, y2s], (4, 5))
    zd = t.dop("add", [c1d, y2d], (4, 5))
    out = t.run()
    # only the rank holding term 0 has a view: the terms plus the value held with term 0
    # (a value added on every rank is counted once per rank by a psum)
    assert out.views(zs, zd, 1) == []
    assert all(v.partial is not None and v.partial.axis >= HELD_BASE and v.partial.lo == 0
               for v in out.views(zs, zd))


# ---------------------------------------------------------------- accumulation (micro-batches)

def micro_batches(t: Tiny, starts: tuple[int, int], zero_first: bool = False):
    """seq y = x @ w over 8 rows of the contraction; rank r holds rows 4r..4r+3 and
    multiplies two slices of 2 local rows (starting at `starts`), then adds them
    (after a zero accumulator when `zero_first`)."""
    xs, xd = t.input((3, 8), (None, "x"))
    ws, wd = t.input((8, 5), ("x", None))
    ys = t.sop("dot_general", [xs, ws], (3, 5), **DOT)
    sop = last_seq_op(t)
    parts = []
    for a in starts:
        xa = t.dop("slice", [xd], (3, 2), start_indices=(0, a), limit_indices=(3, a + 2), strides=None)
        wa = t.dop("slice", [wd], (2, 5), start_indices=(a, 0), limit_indices=(a + 2, 5), strides=None)
        parts.append(t.dop("dot_general", [xa, wa], (3, 5), **DOT))
    acc = parts[0]
    if zero_first:
        acc = t.dop("add", [t.dconst(0.0, (3, 5)), acc], (3, 5))
    acc = t.dop("add", [acc, parts[1]], (3, 5))
    return ys, sop, parts, acc


@pytest.mark.parametrize("starts", [(0, 2), (2, 0)])
def test_adding_terms_of_adjacent_ranges_gives_their_union_that_psum_completes(starts):
    t = Tiny()
    ys, sop, parts, acc = micro_batches(t, starts, zero_first=True)
    sd = t.dop("all_reduce", [acc], (3, 5), reducer="sum", groups=[[0, 1]])
    t.output(ys, sd)
    out = t.run()
    for r in range(2):
        a = starts[0]
        assert vset(out, ys, parts[0], r) == {((0, 0), Partial(0, sop, 0, 4 * r + a, 4 * r + a + 2), UNIT)}
        assert vset(out, ys, acc, r) == {((0, 0), Partial(0, sop, 0, 4 * r, 4 * r + 4), UNIT)}
        assert vset(out, ys, sd, r) == {((0, 0), None, UNIT)}
    assert out.result.verified


@pytest.mark.parametrize("starts", [(0, 0), (1, 2)])
def test_adding_terms_of_the_same_or_overlapping_ranges_has_no_view(starts):
    t = Tiny()
    ys, _, parts, acc = micro_batches(t, starts)
    sd = t.dop("all_reduce", [acc], (3, 5), reducer="sum", groups=[[0, 1]])
    t.output(ys, sd)
    out = t.run()
    assert out.views(ys, parts[1]) and out.views(ys, acc) == []
    first = out.result.failures[0]
    assert (first.op, first.kind) == ("add", "double-counted-terms")


def test_sub_of_adjacent_ranges_or_add_of_a_nonzero_splat_has_no_view():
    t = Tiny()
    ys, sop, parts, _ = micro_batches(t, (0, 2))
    diff = t.dop("sub", [parts[0], parts[1]], (3, 5))
    ones = t.dop("add", [t.dconst(1.0, (3, 5)), parts[0]], (3, 5))
    minus_zero = t.dop("sub", [parts[0], t.dconst(0.0, (3, 5))], (3, 5))
    zero_minus = t.dop("sub", [t.dconst(0.0, (3, 5)), parts[0]], (3, 5))
    out = t.run()
    assert out.views(ys, diff) == [] and out.views(ys, ones) == [] and out.views(ys, zero_minus) == []
    assert vset(out, ys, minus_zero, 1) == {((0, 0), Partial(0, sop, 0, 4, 6), UNIT)}


def test_a_reduction_of_terms_no_rank_holds_is_located_where_the_terms_are_made():
    # each rank reduces only its second micro-batch: rows 0:2 and 4:6 are never multiplied
    t = Tiny()
    ys, _, parts, _ = micro_batches(t, (0, 2))
    sd = t.dop("all_reduce", [parts[1]], (3, 5), reducer="sum", groups=[[0, 1]])
    t.output(ys, sd)
    out = t.run()
    first = out.result.failures[0]
    assert (first.op, first.kind) == ("dot_general", "missing-terms")
    assert "no rank holds the terms [0:2), [4:6)" in first.reason


def accumulated_on_both_sides(t: Tiny, k_sizes=(8, 8, 8), repeat_first=False, sub=False):
    """seq and dist both compute zeros + x0 @ w0 + x1 @ w1 + x2 @ w2 (contraction sizes
    k_sizes, split over "x"); the dist side may add x0 @ w0 again instead of x2 @ w2."""
    dots = []
    for k in k_sizes:
        xs, xd = t.input((3, k), (None, "x"))
        ws, wd = t.input((k, 5), ("x", None))
        dots.append((t.sop("dot_general", [xs, ws], (3, 5), **DOT),
                     t.dop("dot_general", [xd, wd], (3, 5), **DOT)))
    accs = t.sop("add", [t.sconst(0.0, (3, 5)), dots[0][0]], (3, 5))
    accd = t.dop("add", [t.dconst(0.0, (3, 5)), dots[0][1]], (3, 5))
    for i, (ys, yd) in enumerate(dots[1:], 1):
        kind = "sub" if sub and i == 2 else "add"
        accs = t.sop(kind, [accs, ys], (3, 5))
        accd = t.dop(kind, [accd, dots[0][1] if repeat_first and i == 2 else yd], (3, 5))
    return accs, accd


def test_accumulation_on_both_sides_is_one_family_named_by_its_first_leaf():
    t = Tiny()
    accs, accd = accumulated_on_both_sides(t)
    first_dot = next(op.id for op in t.seq.ops if op.kind == "dot_general")
    sd = t.dop("all_reduce", [accd], (3, 5), reducer="sum", groups=[[0, 1]])
    t.output(accs, sd)
    out = t.run()
    for r in range(2):
        assert vset(out, accs, accd, r) == {((0, 0), Partial(0, first_dot, ACC_BASE, 4 * r, 4 * r + 4), UNIT)}
        assert vset(out, accs, sd, r) == {((0, 0), None, UNIT)}
    assert out.result.verified


@pytest.mark.parametrize("variant", ["repeat_first", "sizes", "sub"])
def test_accumulation_of_another_term_other_sizes_or_a_sub_has_no_family(variant):
    t = Tiny()
    accs, accd = accumulated_on_both_sides(
        t, k_sizes=(8, 8, 4) if variant == "sizes" else (8, 8, 8),
        repeat_first=variant == "repeat_first", sub=variant == "sub")
    sd = t.dop("all_reduce", [accd], (3, 5), reducer="sum", groups=[[0, 1]])
    out = t.run()
    assert out.views(accs, sd) == []


def outer_micro_batches(t: Tiny, order=(0, 1)):
    """seq y = x @ w over 8 rows of the contraction laid out as (micro-batch, row) = (2, 4),
    each micro-batch's rows split over "x": rank r's micro-batch i holds rows 4i + 2r, +2
    (block 2i + r of 2 rows), so one rank's micro-batches are not adjacent."""
    xs, xd = t.input((3, 2, 4), (None, None, "x"))
    ws, wd = t.input((2, 4, 5), (None, "x", None))
    x2 = t.sop("reshape", [xs], (3, 8))
    w2 = t.sop("reshape", [ws], (8, 5))
    ys = t.sop("dot_general", [x2, w2], (3, 5), **DOT)
    sop = last_seq_op(t)
    parts = []
    for i in order:
        xi = t.dop("slice", [xd], (3, 1, 2), start_indices=(0, i, 0), limit_indices=(3, i + 1, 2),
                   strides=None)
        wi = t.dop("slice", [wd], (1, 2, 5), start_indices=(i, 0, 0), limit_indices=(i + 1, 2, 5),
                   strides=None)
        parts.append(t.dop("dot_general", [t.dop("reshape", [xi], (3, 2)), t.dop("reshape", [wi], (2, 5))],
                           (3, 5), **DOT))
    acc = t.dop("add", [t.dconst(0.0, (3, 5)), parts[0]], (3, 5))
    acc = t.dop("add", [acc, parts[1]], (3, 5))
    return ys, sop, parts, acc


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_adding_blocks_a_row_apart_is_a_range_of_the_transposed_blocks_that_psum_completes(order):
    t = Tiny()
    ys, sop, parts, acc = outer_micro_batches(t, order)
    sd = t.dop("all_reduce", [acc], (3, 5), reducer="sum", groups=[[0, 1]])
    t.output(ys, sd)
    out = t.run()
    tr = trans_axis(0, 2, 2)   # blocks of 2 terms, 2 blocks per row: a 2 x 2 grid
    for r in range(2):
        i = order[0]
        # block 2i + r is block 2r + i after the transpose
        assert vset(out, ys, parts[0], r) == {
            ((0, 0), Partial(0, sop, 0, 4 * i + 2 * r, 4 * i + 2 * r + 2), UNIT),
            ((0, 0), Partial(0, sop, tr, 4 * r + 2 * i, 4 * r + 2 * i + 2), UNIT)}
        assert ((0, 0), Partial(0, sop, tr, 4 * r, 4 * r + 4), UNIT) in vset(out, ys, acc, r)
        assert vset(out, ys, sd, r) == {((0, 0), None, UNIT)}
    assert out.result.verified


def test_blocks_from_two_ranks_in_one_column_do_not_complete():
    # every rank adds its own first micro-batch to the other rank's second one (a
    # collective_permute of the wrong operand): rank 0 holds blocks 0 and 3, a range
    # only around the end (terms 6, 7, 0, 1 of 8: [6, 10) mod 8, ring_ranges.dl); rank 1
    # blocks 1 and 2, adjacent in both, but the ranks' terms overlap
    t = Tiny()
    ys, _, parts, _ = outer_micro_batches(t)
    moved = t.dop("collective_permute", [parts[1]], (3, 5), pairs=[(0, 1), (1, 0)])
    wrong = t.dop("add", [parts[0], moved], (3, 5))
    sd = t.dop("all_reduce", [wrong], (3, 5), reducer="sum", groups=[[0, 1]])
    out = t.run()
    assert out.views(ys, sd) == []
    assert {(v.partial.lo, v.partial.hi) for v in out.views(ys, wrong, 0)} == {(6, 10)}
    assert {v.partial.lo for v in out.views(ys, wrong, 1)} == {2}


def test_micro_batches_reduced_one_by_one_over_two_axes_are_reported_as_unsupported():
    # rank (a, b) holds rows 4q..4q+3 (q = 2a + b), micro-batch i its rows 4q + 2i, +2;
    # each micro-batch is reduced over "a" and then over "b" before the accumulation:
    # correct, but the second level sums terms interleaved twice over (not tracked)
    mesh = Mesh(("a", "b"), (2, 2))
    t = Tiny(mesh=mesh)
    xs, xd = t.input((3, 16), (None, ("a", "b")))
    ws, wd = t.input((16, 5), (("a", "b"), None))
    ys = t.sop("dot_general", [xs, ws], (3, 5), **DOT)
    done = []
    for i in (0, 2):
        xi = t.dop("slice", [xd], (3, 2), start_indices=(0, i), limit_indices=(3, i + 2), strides=None)
        wi = t.dop("slice", [wd], (2, 5), start_indices=(i, 0), limit_indices=(i + 2, 5), strides=None)
        yi = t.dop("dot_general", [xi, wi], (3, 5), **DOT)
        over_a = t.dop("all_reduce", [yi], (3, 5), reducer="sum", groups=mesh.groups(("a",)))
        done.append(t.dop("all_reduce", [over_a], (3, 5), reducer="sum", groups=mesh.groups(("b",))))
    total = t.dop("add", done, (3, 5))
    t.output(ys, total)
    out = t.run()
    assert not out.result.verified
    first = out.result.failures[0]
    assert (first.op, first.kind) == ("all_reduce", "interleaved-terms")
    assert all(f.kind not in ("wrong-group", "missing-terms") for f in out.result.failures)


# ---------------------------------------------------------------- partial maxima (diagnosis)

def _partial_maxima(t: Tiny, windows=((0, 2), (2, 4))):
    """seq m = max(x, axis 1); rank r holds columns 4r..4r+3 and takes the max of
    each window of its block."""
    xs, xd = t.input((3, 8), (None, "x"))
    ms = t.sop("reduce_max", [xs], (3,), axes=(1,))
    halves = []
    for a, b in windows:
        xa = t.dop("slice", [xd], (3, b - a), start_indices=(0, a), limit_indices=(3, b), strides=None)
        halves.append(t.dop("reduce_max", [xa], (3,), axes=(1,)))
    return ms, halves


def test_merging_partial_maxima_then_pmax_verifies():
    t = Tiny()
    ms, halves = _partial_maxima(t)
    md = t.dop("max", halves, (3,))
    mx = t.dop("all_reduce", [md], (3,), reducer="max", groups=[[0, 1]])
    t.output(ms, mx)
    assert t.run().result.verified


def test_a_merge_that_skips_a_column_is_reported_as_an_unproved_merge_not_a_missing_all_reduce():
    t = Tiny()
    ms, halves = _partial_maxima(t, windows=((0, 1), (2, 4)))   # column 4r + 1 is never read
    md = t.dop("max", halves, (3,))
    mx = t.dop("all_reduce", [md], (3,), reducer="max", groups=[[0, 1]])
    t.output(ms, mx)
    out = t.run()
    assert not out.result.verified
    first = out.result.failures[0]
    assert first.op == "max" and first.kind == "unproved-extrema-merge"
    assert "merges partial maxima with an elementwise max" in first.reason
    assert all("missing all-reduce" not in f.message for f in out.result.failures)


def test_a_partial_max_never_reduced_asks_for_a_pmax():
    t = Tiny()
    xs, xd = t.input((3, 8), (None, "x"))
    ms = t.sop("reduce_max", [xs], (3,), axes=(1,))
    md = t.dop("reduce_max", [xd], (3,), axes=(1,))   # the max of the local columns only
    ys = t.sop("mul", [ms, t.sconst(2.0, (3,))], (3,))
    yd = t.dop("mul", [md, t.dconst(2.0, (3,))], (3,))
    t.output(ys, yd)
    out = t.run()
    first = out.result.failures[0]
    assert first.kind == "unreduced-partial" and first.op == "reduce_max"
    assert first.reason.endswith("add the missing all-reduce with max (pmax)")


# ---------------------------------------------------------------- two partial contracted dims

def _kv_dot(mesh_shape, o_spec, w_spec):
    t = Tiny(mesh=Mesh(("a", "b"), mesh_shape))
    os_, od = t.input((4, 2, 4), o_spec)
    ws, wd = t.input((2, 4, 8), w_spec)
    dn = dict(lhs_contract=(1, 2), rhs_contract=(0, 1), lhs_batch=(), rhs_batch=())
    g, j = 2 // mesh_shape[0] if o_spec[1] else 2, 4 // mesh_shape[1] if o_spec[2] else 4
    ys = t.sop("dot_general", [os_, ws], (4, 8), **dn)
    yd = t.dop("dot_general", [od, wd], (4, 8), **dn)
    assert t.dist.tensors[od].shape == (4, g, j)
    return t, ys, yd


def test_two_partial_contracted_dims_flatten_when_the_outer_holds_one_index():
    # o[b, g, j] w[g, j, d]: rank (a, b) holds KV group a and query heads 2b..2b+1
    t, ys, yd = _kv_dot((2, 2), (None, "a", "b"), ("a", "b", None))
    sd = t.dop("all_reduce", [yd], (4, 8), reducer="sum", groups=[[0, 1, 2, 3]])
    dot = last_seq_op(t)
    out = t.run()
    for r in range(4):
        a, b = divmod(r, 2)
        # the group's index times the heads' range; and the heads' block of 2 times the
        # group's index (partials.dl's product families: both numerically checked)
        assert vset(out, ys, yd, r) == {
            ((0, 0), Partial(0, dot, FLAT_BASE + 32 * 0 + 1, 4 * a + 2 * b, 4 * a + 2 * b + 2), UNIT),
            ((0, 0), Partial(0, dot, prod_axis(2, 1, 2, 0), 2 * b + a, 2 * b + a + 1), UNIT)}
        assert ((0, 0), None, UNIT) in vset(out, ys, sd, r)


def test_two_partial_contracted_dims_reduced_over_one_mesh_axis_are_not_complete():
    t, ys, yd = _kv_dot((2, 2), (None, "a", "b"), ("a", "b", None))
    sd = t.dop("all_reduce", [yd], (4, 8), reducer="sum", groups=[[0, 1], [2, 3]])   # over b only
    out = t.run()
    assert out.views(ys, yd) and not any(v.partial is None for v in out.views(ys, sd))


def _box_of_the_grid(start, head=0):
    """A rank's (2, 2) box of the (4, 4) grid of contracted (group, head) pairs, at
    `start` along the groups and `head` along the heads (both ranks hold the same box)."""
    t = Tiny(mesh=Mesh(("a", "b"), (1, 2)))
    os_, od = t.input((4, 4, 4))
    ws, wd = t.input((4, 4, 8))
    sl_o = t.dop("slice", [od], (4, 2, 2), start_indices=(0, start, head),
                 limit_indices=(4, start + 2, head + 2), strides=None)
    sl_w = t.dop("slice", [wd], (2, 2, 8), start_indices=(start, head, 0),
                 limit_indices=(start + 2, head + 2, 8), strides=None)
    dn = dict(lhs_contract=(1, 2), rhs_contract=(0, 1), lhs_batch=(), rhs_batch=())
    ys = t.sop("dot_general", [os_, ws], (4, 8), **dn)
    yd = t.dop("dot_general", [sl_o, sl_w], (4, 8), **dn)
    return t, ys, yd


def test_an_aligned_box_of_two_partial_contracted_dims_is_a_range_of_their_block_product():
    # groups [2, 4) (block 1 of 2) and heads [0, 2): the terms (block 1, heads 0..1)
    t, ys, yd = _box_of_the_grid(2)
    dot = last_seq_op(t)
    out = t.run()
    assert Partial(0, dot, prod_axis(2, 0, 2, 1), 4, 6) in {v.partial for v in out.views(ys, yd)}


def test_a_box_of_two_partial_contracted_dims_off_the_blocks_has_no_view():
    # groups [1, 3) and heads [1, 3): neither is a block of 2 (nor one index), so the
    # terms are no flat range of any product (groups [1, 3) with heads [0, 2) are: the
    # heads' block 0 times a range of groups)
    t, ys, yd = _box_of_the_grid(1, 1)
    out = t.run()
    assert out.views(ys, yd) == []


# ---------------------------------------------------------------- buggy twins (JAX)

def _sds(*shape):
    return jax.ShapeDtypeStruct(shape, jnp.float32)


def _add_reduced_twice(x, a, b):
    return jax.lax.psum(jax.lax.psum(x @ a, "tp") + x @ b, "tp")   # BUG: x @ a is counted twice


def _kv_psum_one_axis(o, w):
    return jax.lax.psum(jnp.einsum("bgj,gjd->bd", o, w), "b")   # BUG: the KV groups on "a" are never summed


TWINS = [
    ("add", lambda x, a, b: x @ a + x @ b, _add_reduced_twice,
     JMesh(np.array(jax.devices()[:2]), ("tp",)),
     dict(in_specs=(P(None, "tp"), P("tp", None), P("tp", None)), out_specs=P()),
     (_sds(4, 8), _sds(8, 4), _sds(8, 4))),
    ("two_partial_dims", lambda o, w: jnp.einsum("bgj,gjd->bd", o, w), _kv_psum_one_axis,
     JMesh(np.array(jax.devices()[:4]).reshape(2, 2), ("a", "b")),
     dict(in_specs=(P(None, "a", "b"), P("a", "b", None)), out_specs=P(), check_vma=False),
     (_sds(4, 2, 4), _sds(2, 4, 8))),
]


@pytest.mark.parametrize("name,seq,local,mesh,specs,args", TWINS, ids=[t[0] for t in TWINS])
def test_buggy_twin_is_not_verified_and_is_located(name, seq, local, mesh, specs, args):
    dist = jax.jit(jax.shard_map(local, mesh=mesh, **specs))
    xs = [np.random.default_rng(0).standard_normal(a.shape).astype(np.float32) for a in args]
    assert np.max(np.abs(np.asarray(seq(*xs)) - np.asarray(dist(*xs)))) > 1e-3   # really buggy
    res = verify_jax(seq, dist, *args, engine="clingo")
    assert not res.verified
    lines = {fr.line for f in res.failures[:1] for fr in f.frames}
    assert bug_line(local) in lines, [(f.op, f.line, f.message) for f in res.failures[:3]]


# ---------------------------------------------------------------- partial maxima merged

def test_elementwise_max_of_partial_maxima_over_adjacent_ranges_is_their_union():
    # each rank splits its block of columns in two, takes both maxima and merges them
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ms = t.sop("reduce_max", [xs], (4,), axes=(1,))
    lo = t.dop("slice", [xd], (4, 2), start_indices=(0, 0), limit_indices=(4, 2), strides=None)
    hi = t.dop("slice", [xd], (4, 1), start_indices=(0, 2), limit_indices=(4, 3), strides=None)
    mlo = t.dop("reduce_max", [lo], (4,), axes=(1,))
    mhi = t.dop("reduce_max", [hi], (4,), axes=(1,))
    merged = t.dop("max", [mhi, mlo], (4,))
    md = t.dop("all_reduce", [merged], (4,), reducer="max", groups=[[0, 1]])
    t.output(ms, md)
    out = t.run()
    for r in range(2):
        (v,) = out.views(ms, merged, r)
        assert (v.partial.reducer, v.partial.lo, v.partial.hi) == (1, 3 * r, 3 * r + 3)
    assert out.result.verified


def test_max_of_partial_maxima_with_a_gap_has_no_merged_view():
    t = Tiny()
    xs, xd = t.input((4, 6), (None, "x"))
    ms = t.sop("reduce_max", [xs], (4,), axes=(1,))
    a = t.dop("slice", [xd], (4, 1), start_indices=(0, 0), limit_indices=(4, 1), strides=None)
    b = t.dop("slice", [xd], (4, 1), start_indices=(0, 2), limit_indices=(4, 3), strides=None)
    merged = t.dop("max", [t.dop("reduce_max", [a], (4,), axes=(1,)),
                           t.dop("reduce_max", [b], (4,), axes=(1,))], (4,))
    out = t.run()
    assert all(v.partial is None or (v.partial.lo, v.partial.hi) != (0, 3)
               for v in out.views(ms, merged, 0))


# ---------------------------------------------------------------- a value held with term 0

def _row_parallel_bias(holder: int | None, ranks: int = 4):
    """x @ w + b with w's rows split (a partial sum per rank) and b added before the
    psum by the rank `holder` only (zeros elsewhere), or by every rank (None)."""
    t = Tiny(Mesh(("x",), (ranks,)))
    xs, xd = t.input((3, 8), (None, "x"))
    ws, wd = t.input((8, 5), ("x", None))
    bs, bd = t.input((3, 5))
    ys = t.sop("add", [t.sop("dot_general", [xs, ws], (3, 5), **DOT), bs], (3, 5))
    bias = bd if holder is None else t.dop(
        "select_n", [t.drank_is(holder, (3, 5)), t.dconst(0.0, (3, 5)), bd], (3, 5))
    yd = t.dop("add", [t.dop("dot_general", [xd, wd], (3, 5), **DOT), bias], (3, 5))
    t.output(ys, t.dop("all_reduce", [yd], (3, 5), reducer="sum", groups=[list(range(ranks))]))
    return t, t.run()


def test_a_bias_added_by_the_rank_of_term_zero_before_the_psum_verifies():
    for ranks in (2, 4):
        t, out = _row_parallel_bias(0, ranks)
        assert out.result.verified, [f.message for f in out.result.failures]


def test_a_bias_added_on_every_rank_before_the_psum_does_not_verify():
    # the psum adds it `ranks` times
    t, out = _row_parallel_bias(None)
    assert not out.result.verified


def round_trips_added(t: Tiny, repeat_first=False):
    """seq and dist both sum two [8, 5] inputs over their rows (split over "x"), give each
    sum a size-1 dim and sum it away again (jax.grad's round trip of a per-channel
    statistic's cotangent), and add the two; dist may sum the first input twice (the
    tests output them through Tiny.output_negated_psum)."""
    sums = [t.input((8, 5), ("x", None)) for _ in range(2)]
    out = []
    for side, op in (("s", t.sop), ("d", t.dop)):
        leaves = []
        for i in range(2):
            x = sums[0 if side == "d" and repeat_first and i == 1 else i][side == "d"]
            r = op("reduce_sum", [x], (5,), axes=(0,))
            leaves.append(op("reduce_sum", [op("reshape", [r], (1, 5))], (5,), axes=(0,)))
        out.append(op("add", leaves, (5,)))
    return out


def test_sums_through_size_1_round_trips_added_are_one_family_that_psum_completes():
    t = Tiny()
    accs, accd = round_trips_added(t)
    t.output_negated_psum(accs, accd, [[0, 1]])
    out = t.run()
    assert out.result.verified, [f.message for f in out.result.failures]
    first = next(op.id for op in t.seq.ops if op.kind == "reduce_sum")
    assert {v.partial for v in out.views(accs, accd)} == {
        Partial(0, first, ACC_BASE, 4 * r, 4 * r + 4) for r in range(2)}


def test_round_trips_of_the_same_sum_twice_are_not_the_family():
    t = Tiny()
    accs, accd = round_trips_added(t, repeat_first=True)
    t.output_negated_psum(accs, accd, [[0, 1]])
    out = t.run()
    assert not out.result.verified
    assert out.views(accs, accd) == []

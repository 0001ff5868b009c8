"""Induction over lax.scan (dlverify/induction.py): paired scans are verified
once, for every iteration; a carry whose view drifts, or a buggy body, is
verified again with the scans unrolled (and located at its line as before);
every view concluded for the scans' results holds on random data."""
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_problem
from dlverify.frontends.jaxpr import import_jax
from dlverify.numeric import run_both, view_error

B, D, F, TP = 4, 8, 16, 2


def _args(layers):
    f32 = jnp.float32
    return (jax.ShapeDtypeStruct((B, D), f32), jax.ShapeDtypeStruct((layers, D, F), f32),
            jax.ShapeDtypeStruct((layers, F, D), f32))


def _tp(fn, in_specs, out_specs, check_vma=True):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                 check_vma=check_vma))


SPECS = (P(), P(None, None, "tp"), P(None, "tp", None))


def seq_stack(x, w1, w2):
    def body(h, w):
        y = h + jnp.tanh(jnp.tanh(h @ w[0]) @ w[1])
        return y, y * 2.0
    return jax.lax.scan(body, x, (w1, w2))


def dist_stack(x, w1, w2):
    def body(h, w):
        y = h + jnp.tanh(jax.lax.psum(jnp.tanh(h @ w[0]) @ w[1], "tp"))
        return y, y * 2.0
    return jax.lax.scan(body, x, (w1, w2))


def dist_stack_missing_psum(x, w1, w2):
    def body(h, w):
        y = h + jnp.tanh(jnp.tanh(h @ w[0]) @ w[1])  # BUG: no psum of the partial sums
        return y, y * 2.0
    return jax.lax.scan(body, x, (w1, w2))


def _check_views_numerically(res):
    """Every complete view (those of the scans' results included) holds on random data."""
    numeric = run_both(res.problem, seed=3)
    complete = [v for v in res.views if v.partial is None]
    assert complete
    bad = [(v, view_error(numeric, res.problem, v)) for v in complete]
    assert not [b for b in bad if b[1] > 1e-6], bad[:3]


def _verify(seq, dist, args):
    problem = import_jax(seq, dist, args, name="induction")
    return problem, verify_problem(problem, engine="clingo")


@pytest.mark.parametrize("layers", [1, 5])
def test_paired_scans_verify_by_induction(layers):
    problem, res = _verify(seq_stack, _tp(dist_stack, SPECS, (P(), P())), _args(layers))
    assert res.verified, [f.message for f in res.failures]
    assert len(res.problem.scans) == 1
    assert any("verified by induction" in n for n in res.notes), res.notes
    assert res.segment_plan is not None and len(res.segment_plan.inductions) == 1
    _check_views_numerically(res)
    # the stacked outputs ys (out1) got their view from the rows' view
    ys = res.problem.scans[0].seq.ys[0]
    assert any(v.seq == ys for v in res.views)


def test_export_does_not_grow_with_the_number_of_iterations():
    dist = _tp(dist_stack, SPECS, (P(), P()))
    short = import_jax(seq_stack, dist, _args(2))
    long = import_jax(seq_stack, dist, _args(64))
    for a, b in ((short.seq, long.seq), (short.dist, long.dist),
                 (short.scans[0].body.seq, long.scans[0].body.seq),
                 (short.scans[0].body.dist, long.scans[0].body.dist)):
        assert len(a.ops) == len(b.ops)
    res = verify_problem(long, engine="clingo")
    assert res.verified and any("verified by induction" in n for n in res.notes)


def test_missing_psum_in_the_body_never_verifies_and_is_located():
    _, res = _verify(seq_stack, _tp(dist_stack_missing_psum, SPECS, (P(), P()), False), _args(4))
    assert not res.verified
    assert any("unrolled" in n for n in res.notes), res.notes
    assert not res.problem.scans  # the verdict comes from the unrolled programs
    from conftest import bug_line
    line = bug_line(dist_stack_missing_psum)
    assert line in {fr.line for fr in res.failures[0].frames}, \
        [(f.op, f.line, f.message) for f in res.failures[:3]]


# A carry whose view drifts: each iteration passes rank r's block to rank r + 1.
def roll_pair(length):
    def seq_roll(x):
        return jax.lax.scan(lambda h, _: (jnp.tanh(h), None), x, None, length=length)[0]

    def dist_roll(x):
        perm = [(r, (r + 1) % TP) for r in range(TP)]
        return jax.lax.scan(lambda h, _: (jax.lax.ppermute(jnp.tanh(h), "tp", perm), None), x,
                            None, length=length)[0]

    return seq_roll, _tp(dist_roll, (P(None, "tp"),), P(None, "tp"))


@pytest.mark.parametrize("length,expected", [(TP, True), (TP + 1, False)])
def test_a_drifting_carry_is_unrolled(length, expected):
    """The view changes at every iteration: the induction never closes, and the
    unrolled programs decide (back in place after TP iterations, not after TP + 1)."""
    seq, dist = roll_pair(length)
    problem, res = _verify(seq, dist, (jax.ShapeDtypeStruct((B, D), jnp.float32),))
    assert len(problem.scans) == 1  # paired, then unrolled at the engine
    assert res.verified == expected, [f.message for f in res.failures]
    assert not any("verified by induction" in n for n in res.notes)
    assert any("the carry's view after the body differs from before" in n
               for n in res.notes), res.notes
    assert not res.problem.scans


def test_scans_that_do_not_pair_are_unrolled_at_export():
    """Different lengths: no summaries, the programs are built unrolled."""
    def seq(x, w1, w2):
        return seq_stack(x, w1, w2)

    def dist(x, w1, w2):
        h, ys = dist_stack(x, w1[:2], w2[:2])
        h2, ys2 = dist_stack(h, w1[2:], w2[2:])
        return h2, jnp.concatenate([ys, ys2])

    problem = import_jax(seq, _tp(dist, SPECS, (P(), P())), _args(4))
    assert not problem.scans
    res = verify_problem(problem, engine="clingo")
    assert res.verified
    # the verdict says why no induction was tried
    (note,) = [n for n in res.notes if n.startswith("scans unrolled")]
    assert note.endswith("the sequential program has 1 scans and the distributed one 2")


def fori_pair(lo, hi):
    """fori_loop(lo, hi) reading the stacked weights at the counter: w[i]."""
    def seq(x, w1, w2):
        return jax.lax.fori_loop(lo, hi, lambda i, h: h + jnp.tanh(jnp.tanh(h @ w1[i]) @ w2[i]), x)

    def dist(x, w1, w2):
        return jax.lax.fori_loop(
            lo, hi, lambda i, h: h + jnp.tanh(jax.lax.psum(jnp.tanh(h @ w1[i]) @ w2[i], "tp")), x)

    return seq, _tp(dist, SPECS, P())


@pytest.mark.parametrize("lo,hi", [(0, 4), (1, 3)])
def test_fori_loop_rows_read_at_the_counter_verify_by_induction(lo, hi):
    """The counter's index is evaluated for every iteration: w[i] is row i - lo of
    w[lo:hi], a scanned operand, and the body is verified once."""
    seq, dist = fori_pair(lo, hi)
    problem, res = _verify(seq, dist, _args(4))
    assert res.verified, [f.message for f in res.failures]
    assert any("verified by induction" in n for n in res.notes), res.notes
    assert len(res.problem.scans[0].dist.xs) == 2  # w1 and w2 became scanned operands
    _check_views_numerically(res)


def dist_stack_wrong_ys(x, w1, w2):
    def body(h, w):
        y = h + jnp.tanh(jax.lax.psum(jnp.tanh(h @ w[0]) @ w[1], "tp"))
        return y, y * 3.0  # BUG: the stacked output is scaled by 3, not 2
    return jax.lax.scan(body, x, (w1, w2))


def test_wrong_stacked_outputs_never_verify():
    """The carry closes (its view is right), the rows of ys are wrong: not verified."""
    _, res = _verify(seq_stack, _tp(dist_stack_wrong_ys, SPECS, (P(), P())), _args(3))
    assert not res.verified
    assert any("unrolled" in n for n in res.notes), res.notes


def test_a_bug_after_the_first_iteration_never_verifies():
    """The psum is skipped from the second iteration on (the counter decides): the
    body's result has no view for an unknown counter, so the induction does not
    close, and the unrolled programs find the partial sums of iteration 1."""
    def seq(x, w1, w2):
        return jax.lax.fori_loop(0, 3, lambda i, h: h + jnp.tanh(jnp.tanh(h @ w1[i]) @ w2[i]), x)

    def dist(x, w1, w2):
        def body(i, h):
            part = jnp.tanh(h @ w1[i]) @ w2[i]
            return h + jnp.tanh(jnp.where(i == 0, jax.lax.psum(part, "tp"), part))  # BUG
        return jax.lax.fori_loop(0, 3, body, x)

    problem, res = _verify(seq, _tp(dist, SPECS, P(), False), _args(3))
    assert len(problem.scans) == 1
    assert not res.verified
    assert not any("verified by induction" in n for n in res.notes)
    assert any("unrolled" in n for n in res.notes), res.notes


def remat_training(block):
    """The gradient of every stacked weight through a scan of checkpointed blocks
    (MaxText's remat + scan): JAX's transpose is a reversed scan."""
    def f(x, w1, w2):
        body = jax.checkpoint(lambda h, w: (block(h, w), None))

        def loss(w1, w2):
            return jnp.sum(jax.lax.scan(body, x, (w1, w2))[0] ** 2)
        return jax.grad(loss, argnums=(0, 1))(w1, w2)
    return f


def test_training_through_a_remat_scan_verifies_by_induction():
    """Both scans (forward, and the reversed backward one reading the forward's
    stacked carries) are concluded by induction, though the IR passes rewrite
    the ops computing the backward scan's operands."""
    seq = remat_training(lambda h, w: h + jnp.tanh(jnp.tanh(h @ w[0]) @ w[1]))
    dist = remat_training(
        lambda h, w: h + jnp.tanh(jax.lax.psum(jnp.tanh(h @ w[0]) @ w[1], "tp")))
    grads = (P(None, None, "tp"), P(None, "tp", None))
    problem, res = _verify(seq, _tp(dist, SPECS, grads), _args(5))
    assert len(problem.scans) == 2
    assert res.verified, [f.message for f in res.failures]
    assert any("verified by induction" in n for n in res.notes), res.notes
    assert len(res.segment_plan.inductions) == 2
    _check_views_numerically(res)


# ---------------------------------------------------------------- seeds and closure, by hand

def _side(ids, body_outputs):
    from dlverify.induction import ScanSide
    from dlverify.ir import Graph

    body = Graph("body")
    body.outputs = body_outputs
    return ScanSide("f.py:1", 3, False, consts=[], body_consts=[], init=[ids["init"]],
                    body_carry=[ids["carry"]], xs=[ids["xs"]], body_rows=[ids["row"]],
                    final=[ids["final"]], ys=[ids["ys"]], body=body)


def _summary():
    from dlverify.induction import ScanSummary
    from dlverify.memo import offsets_record as rec

    s = dict(init=1, carry=2, xs=3, row=4, final=5, ys=6, out=7, y=8)
    d = {k: v + 100 for k, v in s.items()}
    sc = ScanSummary(_side(s, [s["out"], s["y"]]), _side(d, [d["out"], d["y"]]), body=None)
    one = (0, 0, 0, 0)
    outer = {
        s["init"]: {(s["init"], d["init"], 0, rec((0, 4)), None, one)},
        s["xs"]: {(s["xs"], d["xs"], 0, rec((0, 0, 4)), None, one),   # rows: (0, 4)
                  (s["xs"], d["xs"], 1, rec((1, 0, 4)), None, one),   # a block of the layers: no seed
                  (s["xs"], d["xs"], 2, rec((0, 0, 4)), (0, 9, 0, 0, 4), one)},  # partial: no seed
    }
    return sc, s, d, outer, rec, one


def test_seeds_are_rows_of_stacked_views_starting_at_layer_zero():
    from dlverify.induction import body_seeds

    sc, s, d, outer, rec, one = _summary()
    assert body_seeds(sc, outer) == {(s["carry"], d["carry"], 0, rec((0, 4)), None, one),
                                     (s["row"], d["row"], 0, rec((0, 4)), None, one)}


def test_closure_is_required_and_results_get_stacked_views():
    from dlverify.induction import InductionOpen, body_seeds, conclude

    sc, s, d, outer, rec, one = _summary()
    seeds = body_seeds(sc, outer)
    y_view = (s["y"], d["y"], 0, rec((0, 2)), None, one)
    closed = seeds | {(s["out"], d["out"], 0, rec((0, 4)), None, one), y_view}
    assert set(conclude(sc, seeds, closed)) == {(s["final"], d["final"], 0, rec((0, 4)), None, one),
                                                (s["ys"], d["ys"], 0, rec((0, 0, 2)), None, one)}
    drifted = seeds | {(s["out"], d["out"], 0, rec((0, 0)), None, one), y_view}
    with pytest.raises(InductionOpen, match="the carry's view after the body differs"):
        conclude(sc, seeds, drifted)


def test_a_body_reading_its_initial_carry_as_a_const_verifies_by_induction():
    """x is both the initial carry and a const of the body (a skip connection to the
    input): no hypothesis relates the const to the carry, so the induction closes."""
    def seq(x, w1, w2):
        return jax.lax.scan(lambda h, w: (h + jnp.tanh(jnp.tanh((h + x) @ w[0]) @ w[1]), None),
                            x, (w1, w2))[0]

    def dist(x, w1, w2):
        return jax.lax.scan(
            lambda h, w: (h + jnp.tanh(jax.lax.psum(jnp.tanh((h + x) @ w[0]) @ w[1], "tp")), None),
            x, (w1, w2))[0]

    problem, res = _verify(seq, _tp(dist, SPECS, P()), _args(3))
    assert res.verified, [f.message for f in res.failures]
    assert any("verified by induction" in n for n in res.notes), res.notes
    _check_views_numerically(res)


def aux_pair(dist_init, dist_scale):
    """A scan carrying a scalar accumulator started at a constant (an aux loss)."""
    def make(local, init, scale):
        def f(x, w1, w2):
            def body(c, w):
                h, aux = c
                part = jnp.tanh(h @ w[0]) @ w[1]
                y = h + jnp.tanh(jax.lax.psum(part, "tp") if local else part)
                return (y, aux + scale * jnp.sum(y * y)), None
            return jax.lax.scan(body, (x, jnp.float32(init)), (w1, w2))[0]
        return f

    return make(False, 0.0, 1.0), _tp(make(True, dist_init, dist_scale), SPECS, (P(), P()))


@pytest.mark.parametrize("init,scale,expected", [(0.0, 1.0, True), (1.0, 1.0, False),
                                                 (0.0, 2.0, False)])
def test_a_constant_initialised_accumulator(init, scale, expected):
    """Equal constant initial carries are related (any block of one is the other);
    a different start value or a different increment never verifies."""
    seq, dist = aux_pair(init, scale)
    problem, res = _verify(seq, dist, _args(3))
    assert res.verified == expected, [f.message for f in res.failures]
    assert any("verified by induction" in n for n in res.notes) == expected, res.notes
    if expected:
        _check_views_numerically(res)

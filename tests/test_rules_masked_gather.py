"""dlverify/index_ranges.py and dlverify/masked_gather.py: index ranges, interval
predicates and the one-hot rewrite of masked and in-bounds gathers.

Every claim is checked on data: the rewritten graphs compute what the original
ones compute (integer inputs far outside the vocab included, and the int32
extremes), every integer tensor stays inside the values derived for it, every
interval predicate is its definition, and the rewrite is refused (the case stays
"not verified") for the buggy twins: a mask off by one, a mask over another
tensor than the index, a gather that may read out of range."""
import copy

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_problem
from dlverify.frontends.jaxpr import import_jax
from dlverify.index_ranges import IndexFacts
from dlverify.interpret import Interpreter
from dlverify.masked_gather import rewrite_masked_gathers
from dlverify.passes import fold

TP, TOKENS, VOCAB, D = 2, 6, 8, 3
V_LOCAL = VOCAB // TP
I32 = np.iinfo(np.int32)


def _args():
    return (jax.ShapeDtypeStruct((TOKENS,), jnp.int32), jax.ShapeDtypeStruct((VOCAB, D), jnp.float32),
            jax.ShapeDtypeStruct((TOKENS, VOCAB), jnp.float32))


def _dist(local_fn):
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(), P("tp", None), P(None, "tp")),
                                 out_specs=(P(), P()), check_vma=False))


def _seq(ids, table, logits):
    ids = ids % VOCAB
    return jnp.take(table, ids, axis=0), jnp.take_along_axis(logits, ids[:, None], axis=-1)[:, 0]


def _masked(ids, table, logits, upper_inclusive=False, mask_ids=None):
    ids = ids % VOCAB
    first = jax.lax.axis_index("tp") * V_LOCAL
    m = ids if mask_ids is None else mask_ids
    outside = (m < first) | ((m > first + V_LOCAL) if upper_inclusive else (m >= first + V_LOCAL))
    local = jnp.where(outside, 0, ids - first)
    rows = jnp.where(outside[:, None], 0.0, jnp.take(table, local, axis=0))
    picked = jnp.take_along_axis(logits, local[:, None], axis=-1)[:, 0]
    return jax.lax.psum(rows, "tp"), jax.lax.psum(jnp.where(outside, 0.0, picked), "tp")


def _inputs(problem, rng, ints):
    seq_in, dist_in = [], []
    for s, d, rel in zip(problem.seq.inputs, problem.dist.inputs, problem.inputs):
        t = problem.seq.tensors[s]
        if t.dtype == "int32":
            x = rng.choice(ints, t.shape).astype(np.int32)
        else:
            x = rng.standard_normal(t.shape)
        seq_in.append([x])
        dshape = problem.dist.tensors[d].shape
        dist_in.append([x[tuple(slice(o, o + n) for o, n in zip(rel.offsets[r], dshape))]
                        for r in range(problem.mesh.size)])
    return seq_in, dist_in


def _outputs(problem, seq_in, dist_in):
    mesh = problem.mesh
    sv = Interpreter(problem.seq, 1).run(seq_in)
    dv = Interpreter(problem.dist, mesh.size, lambda r, a: mesh.coords(r)[a]).run(dist_in)
    return [sv[t][0] for t in problem.seq.outputs], [dv[t] for t in problem.dist.outputs]


INTS = np.concatenate([np.arange(-20, 20), [I32.min, I32.min + 1, I32.max - 1, I32.max]])


def _check_rewrite_exact(problem, seq_fn, dist_fn):
    """The rewritten graphs compute what JAX computes for both programs, on every rank
    (the outputs are replicated)."""
    new = copy.deepcopy(problem)
    assert rewrite_masked_gathers(new)
    assert any(op.kind == "gather" for op in problem.dist.ops)
    assert not any(op.kind == "gather" for op in new.dist.ops + new.seq.ops)
    rng = np.random.default_rng(0)
    for _ in range(5):
        seq_in, dist_in = _inputs(problem, rng, INTS)
        args = [x[0].astype(np.float32) if x[0].dtype != np.int32 else x[0] for x in seq_in]
        got_s, got_d = _outputs(new, seq_in, dist_in)
        for want, s, d in zip(seq_fn(*args), got_s, got_d):
            np.testing.assert_allclose(s, np.asarray(want), rtol=1e-5, atol=1e-5)
        for want, d in zip(dist_fn(*args), got_d):
            for r in range(problem.mesh.size):
                np.testing.assert_allclose(d[r], np.asarray(want), rtol=1e-5, atol=1e-5)
    return new


def _bcast(base, dims, shape):
    """broadcast_in_dim: out[i] = base[i[dims]]."""
    order = np.argsort(dims)
    lifted = [1] * len(shape)
    for j in order:
        lifted[dims[j]] = base.shape[j]
    return np.broadcast_to(np.transpose(base, order).reshape(lifted), shape)


def _check_ranges_hold(graph, mesh, values):
    """values(t) holds every element of t on every rank; predicate(t) is its definition;
    known_bool(t) is t's value."""
    ranks = 1 if mesh is None else mesh.size
    facts = IndexFacts(graph, ranks, fold(graph, mesh).splat)
    checked = 0
    for t, ten in graph.tensors.items():
        if t not in values:
            continue
        got = facts.values(t) if ten.dtype.startswith("int") else None
        for r in range(ranks if got is not None else 0):
            x = values[t][r].astype(np.int64)
            inside = np.zeros(x.shape, bool)
            for lo, hi in got[r]:
                inside |= (x >= lo) & (x < hi)
            assert inside.all(), (t, got[r], x)
        pred = facts.predicate(t) if ten.dtype == "bool" else None
        for r in range(ranks if pred is not None else 0):
            base = _bcast(values[pred.base][r].astype(np.int64), pred.dims, ten.shape)
            member = np.zeros(ten.shape, bool)
            for lo, hi in pred.sets[r]:
                member |= (base >= lo) & (base < hi)
            np.testing.assert_array_equal(member, values[t][r].astype(bool), err_msg=str((t, pred)))
            checked += 1
        known = facts.known_bool(t) if ten.dtype == "bool" else None
        for r in range(ranks if known is not None else 0):
            assert (values[t][r] == known[r]).all(), (t, known)
    return checked


def test_masked_gathers_rewrite_exactly_and_verify():
    problem = import_jax(_seq, _dist(_masked), _args(), "masked")
    new = _check_rewrite_exact(problem, _seq, _dist(_masked))
    res = verify_problem(import_jax(_seq, _dist(_masked), _args(), "masked"), engine="clingo")
    assert res.verified, [f.message for f in res.failures]
    assert new.dist.ops and new.seq.ops


def test_index_values_and_predicates_hold_on_data():
    # on the rewritten graphs: every index computation of both programs is still there
    problem = import_jax(_seq, _dist(_masked), _args(), "masked")
    rewrite_masked_gathers(problem)
    rng = np.random.default_rng(1)
    for _ in range(3):
        seq_in, dist_in = _inputs(problem, rng, INTS)
        mesh = problem.mesh
        sv = Interpreter(problem.seq, 1).run(seq_in)
        dv = Interpreter(problem.dist, mesh.size, lambda r, a: mesh.coords(r)[a]).run(dist_in)
        assert _check_ranges_hold(problem.seq, None, sv) > 0
        assert _check_ranges_hold(problem.dist, mesh, dv) > 0


def test_the_in_bounds_masks_fold_to_true():
    # ids % V lies in [0, V): the fill mask of the sequential take is all true,
    # and so is the one of the distributed take of where(outside, 0, ids - first)
    problem = import_jax(_seq, _dist(_masked), _args(), "masked")
    for graph, mesh in ((problem.seq, None), (problem.dist, problem.mesh)):
        splat = fold(graph, mesh).splat
        gathered = {op.output for op in graph.ops if op.kind == "gather"}
        fills = [op for op in graph.ops if op.kind == "select_n" and op.inputs[2] in gathered]
        assert fills and all(splat.get(op.inputs[0]) is not None and all(splat[op.inputs[0]])
                             for op in fills)


def test_a_mask_off_by_one_is_not_rewritten_and_not_verified():
    def off_by_one(ids, table, logits):
        return _masked(ids, table, logits, upper_inclusive=True)
    problem = import_jax(_seq, _dist(off_by_one), _args(), "off_by_one")
    assert not rewrite_masked_gathers(copy.deepcopy(problem))
    assert not verify_problem(problem, engine="clingo").verified


def test_a_mask_over_another_tensor_is_not_rewritten():
    def other_mask(ids, table, logits):
        return _masked(ids, table, logits, mask_ids=(ids + 1) % VOCAB)
    problem = import_jax(_seq, _dist(other_mask), _args(), "other_mask")
    assert not rewrite_masked_gathers(copy.deepcopy(problem))
    assert not verify_problem(problem, engine="clingo").verified


def test_an_index_that_may_wrap_around_is_not_affine():
    # ids - first without the % V: for ids near INT32_MIN the difference wraps, so it
    # is not ids shifted (only itself); masking by it still rewrites exactly, but the
    # one-hot of `local` meets nothing of the sequential program
    def raw(ids, table, logits):
        local = ids - jax.lax.axis_index("tp") * V_LOCAL
        outside = (local < 0) | (local >= V_LOCAL)
        rows = jnp.where(outside[:, None], 0.0, jnp.take(table, jnp.where(outside, 0, local), axis=0))
        return jax.lax.psum(rows, "tp"), jax.lax.psum(logits[:, 0], "tp")
    problem = import_jax(_seq, _dist(raw), _args(), "raw")
    facts = IndexFacts(problem.dist, TP, fold(problem.dist, problem.mesh).splat)
    sub = next(op for op in problem.dist.ops if op.kind == "sub" and op.inputs[0] in problem.dist.inputs)
    assert facts.affine(sub.output).base == sub.output
    _check_rewrite_exact(problem, _seq, _dist(raw))
    assert not verify_problem(import_jax(_seq, _dist(raw), _args(), "raw"), engine="clingo").verified


def test_gathers_along_a_later_dim_rewrite_exactly_and_verify():
    # the table transposed (D, V) and the logits (V, T): the vocab dim is not the first
    # of the take, and is the first of the take_along_axis; the one-hot contraction
    # is transposed back to the gather's layout
    def args():
        return (jax.ShapeDtypeStruct((TOKENS,), jnp.int32), jax.ShapeDtypeStruct((D, VOCAB), jnp.float32),
                jax.ShapeDtypeStruct((VOCAB, TOKENS), jnp.float32))

    def seq(ids, table_t, logits_t):
        ids = ids % VOCAB
        return jnp.take(table_t, ids, axis=1), jnp.take_along_axis(logits_t, ids[None, :], axis=0)[0]

    def local_fn(ids, table_t, logits_t):
        ids = ids % VOCAB
        first = jax.lax.axis_index("tp") * V_LOCAL
        outside = (ids < first) | (ids >= first + V_LOCAL)
        local = jnp.where(outside, 0, ids - first)
        rows = jnp.where(outside[None, :], 0.0, jnp.take(table_t, local, axis=1))
        picked = jnp.take_along_axis(logits_t, local[None, :], axis=0)[0]
        return jax.lax.psum(rows, "tp"), jax.lax.psum(jnp.where(outside, 0.0, picked), "tp")

    mesh = dlverify.host_mesh((TP,), ("tp",))
    dist = jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)),
                                 out_specs=(P(), P()), check_vma=False))
    _check_rewrite_exact(import_jax(seq, dist, args(), "later_dim"), seq, dist)
    res = verify_problem(import_jax(seq, dist, args(), "later_dim"), engine="clingo")
    assert res.verified, [f.message for f in res.failures]


def test_a_long_index_chain_is_cut_short_not_a_crash():
    # 3000 chained adds of known integers into a mask: the analysis follows at most
    # MAX_DEPTH producers per query (memoised in op order), so no deep recursion
    from dlverify.ir import Graph, GraphBuilder, IdAllocator
    g = Graph("sequential")
    b = GraphBuilder(g, IdAllocator())
    x = b.tensor((4,), "int32", "ids")
    g.inputs.append(x)
    one = b.op("broadcast_in_dim", [b.constant(np.asarray(1, np.int32), (), "int32")], (4,), "int32",
               {"broadcast_dimensions": ()})
    t = b.op("rem", [x, b.op("broadcast_in_dim", [b.constant(np.asarray(8, np.int32), (), "int32")],
                                (4,), "int32", {"broadcast_dimensions": ()})], (4,), "int32")
    for _ in range(3000):
        t = b.op("add", [t, one], (4,), "int32")
    zero = b.op("broadcast_in_dim", [b.constant(np.asarray(-8, np.int32), (), "int32")], (4,), "int32",
                {"broadcast_dimensions": ()})
    mask = b.op("gt", [t, zero], (4,), "bool")
    g.outputs.append(mask)
    splat = fold(g, None).splat            # analysed in op order: each query one step deep
    assert splat.get(mask) == [True]      # rem(x, 8) + 3000 > -8 everywhere
    fresh = IndexFacts(g, 1, splat)       # queried from the end: cut after MAX_DEPTH producers
    assert fresh.values(t) is not None and fresh.known_bool(mask) is None


def _embed_grad_args():
    return (jax.ShapeDtypeStruct((TOKENS,), jnp.int32), jax.ShapeDtypeStruct((VOCAB, D + 1), jnp.float32),
            jax.ShapeDtypeStruct((TOKENS, D + 1), jnp.float32))


def _embed_grad_seq(ids, table, t):
    return (jax.grad(lambda tb: jnp.sum((jnp.take(tb, ids % VOCAB, axis=0) - t) ** 2))(table),)


def _embed_grad_dist(upper_inclusive=False):
    def local(ids, table, t):
        def embed(tb):
            i = ids % VOCAB
            first = jax.lax.axis_index("tp") * V_LOCAL
            outside = (i < first) | ((i > first + V_LOCAL) if upper_inclusive else (i >= first + V_LOCAL))
            rows = jnp.take(tb, jnp.where(outside, 0, i - first), axis=0)
            return jax.lax.psum(jnp.where(outside[:, None], 0.0, rows), "tp")
        return (jax.grad(lambda tb: jnp.sum((embed(tb) - t) ** 2))(table),)
    mesh = dlverify.host_mesh((TP,), ("tp",))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("tp", None), P()),
                                 out_specs=(P("tp", None),)))


def test_the_gradient_of_a_masked_lookup_rewrites_exactly_and_verifies():
    # the table's gradient: a one-hot scatter-add of the masked cotangent rows
    # (frontends/jaxpr/scatter.py), the mask folded into the one-hot of ids - first
    dist = _embed_grad_dist()
    problem = import_jax(_embed_grad_seq, dist, _embed_grad_args(), "embed_grad")
    new = copy.deepcopy(problem)
    assert rewrite_masked_gathers(new)
    masked = [op for op in new.dist.ops if op.kind == "select_n" and
              new.dist.tensors[op.output].dtype == "float32"]
    assert not masked   # the forward's and the backward's masks are both gone
    rng = np.random.default_rng(2)
    mesh = problem.mesh
    for _ in range(5):
        seq_in, dist_in = _inputs(problem, rng, INTS)
        args = [x[0] if x[0].dtype == np.int32 else x[0].astype(np.float32) for x in seq_in]
        dv = Interpreter(new.dist, mesh.size, lambda r, a: mesh.coords(r)[a]).run(dist_in)
        want = np.asarray(dist(*args)[0])
        for r in range(mesh.size):
            np.testing.assert_allclose(dv[new.dist.outputs[0]][r], want[r * V_LOCAL:(r + 1) * V_LOCAL],
                                       rtol=1e-5, atol=1e-5)
    res = verify_problem(import_jax(_embed_grad_seq, dist, _embed_grad_args(), "embed_grad"),
                         engine="clingo")
    assert res.verified, [f.message for f in res.failures]


def test_the_gradient_of_a_lookup_masked_off_by_one_is_not_verified():
    dist = _embed_grad_dist(upper_inclusive=True)
    problem = import_jax(_embed_grad_seq, dist, _embed_grad_args(), "embed_grad_bug")
    new = copy.deepcopy(problem)
    rewrite_masked_gathers(new)
    assert any(op.kind == "gather" for op in new.dist.ops)   # neither mask is folded
    assert not verify_problem(problem, engine="clingo").verified

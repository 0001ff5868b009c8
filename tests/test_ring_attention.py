"""Ring attention and the online softmax (issue 15 item 5): the shift-free rewrite of
the running-max merges (dlverify/online_softmax.py, dlverify/shift_algebra.py),
cyclic ranges of partial terms (datalog/ring_ranges.dl), and examples/ring_attention.py.

Soundness: the rewrite keeps every output of both programs on random data (standard
normal inputs, where the scores are small, so exp(s - m) and every rescaled form the
rewrite writes are finite and the comparison is exact up to rounding); the theorems it
applies are checked on their own in numpy; every view the rules derive is checked
against a run of both programs; every buggy twin is not verified and is located at
its `# BUG` line.
"""
from __future__ import annotations

import copy
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import bug_line
from dlverify.frontends.jaxpr import import_jax
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_jax
from dlverify.numeric import partial_sum_errors, run_both, value_error, view_error
from dlverify.online_softmax import shift_free_merges
from dlverify.pass_order import rewrite
from dlverify.shift_algebra import ShiftAnalysis

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ring_attention.py"
CASES = ["ring_attention_forward", "ring_attention_causal", "ring_attention_fori_loop",
         "ring_attention_fori_loop_causal", "ring_attention_grads", "ring_attention_flash_backward"]
TWINS = ["ring_bug_output_not_rescaled", "ring_bug_rescale_inverted",
         "ring_bug_causal_mask_local_positions", "ring_bug_mask_wrong_direction",
         "ring_bug_loop_sum_not_rescaled", "ring_bug_backward_block_max"]
MERGE_TWINS = ["ring_bug_output_not_rescaled", "ring_bug_rescale_inverted",
               "ring_bug_loop_sum_not_rescaled"]   # a merge whose rescale is missing or wrong


def _example():
    import importlib.util
    spec = importlib.util.spec_from_file_location("ring_attention_example", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _case(name):
    return getattr(_example(), name)()


def _outputs_unchanged_by_the_rewrite(problem):
    before = copy.deepcopy(problem)
    rewrite(problem)
    for seed in (0, 1):
        a, b = run_both(before, seed), run_both(problem, seed)
        for g, ra, rb in (("seq", a.seq, b.seq), ("dist", a.dist, b.dist)):
            for t in getattr(problem, g).outputs:
                for x, y in zip(ra[t], rb[t]):
                    assert np.all(np.isfinite(x)) and np.all(np.isfinite(y)), (g, t)
                    assert value_error(np.asarray(y, np.float64), np.asarray(x, np.float64)) <= 1e-9, (g, t)
    return problem


def verified_example(example_runs, path, name):
    """The example case's result, asserted verified with every derived view holding on a
    run of both programs."""
    res = example_runs.run(path, name).result
    assert res.verified, [(f.op, f.line, f.message) for f in res.failures[:3]]
    _views_hold(res)
    return res


def located_twin(example_runs, path, name):
    """The buggy twin's result, asserted not verified with its first failure at the
    twin's `# BUG` line."""
    run = example_runs.run(path, name)
    res = run.result
    assert not res.verified
    lines = {fr.line for fr in res.failures[0].frames if fr.file == str(path)}
    assert bug_line(run.case.dist) in lines, [(f.op, f.line, f.message) for f in res.failures[:3]]
    return res


def _views_hold(res):
    run = run_both(res.problem, seed=3)
    for v in res.views:
        if v.partial is None:
            assert view_error(run, res.problem, v) <= 1e-6, v
    for key, err in partial_sum_errors(run, res.problem, res.views):
        assert err < 1e-6, key


# ------------------------------------------------------------------ the theorems, in numpy

def test_exponentials_of_statistics_telescope():
    """exp(x + sum c_i k_i) * exp(sum g_i k_i) = exp(x + sum (c_i + g_i) k_i), and a
    row factor commutes with a contraction over another dim and a row sum."""
    rng = np.random.default_rng(0)
    x, v = rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
    k1, k2 = rng.standard_normal((4, 1)), rng.standard_normal((4, 1))
    assert np.allclose(np.exp(x - k1) * np.exp(k1 - k2), np.exp(x - k2))
    e = np.exp(k1 - k2)
    assert np.allclose((np.exp(x - k1) * e) @ v, (np.exp(x - k1) @ v) * e)
    assert np.allclose((np.exp(x - k1) * e).sum(1, keepdims=True), np.exp(x - k1).sum(1, keepdims=True) * e)


def test_the_online_merge_is_the_sum_of_terms_shifted_by_the_final_max():
    """The merge the rewrite recognises: o_N = sum_j exp(s_j - m_N) @ v_j, l_N likewise,
    and o_N / l_N the softmax of the concatenated rows times the concatenated v."""
    rng = np.random.default_rng(1)
    s = [rng.standard_normal((3, 4)) * 3 for _ in range(4)]
    v = [rng.standard_normal((4, 2)) for _ in range(4)]
    m = s[0].max(1, keepdims=True)
    o, l = np.exp(s[0] - m) @ v[0], np.exp(s[0] - m).sum(1, keepdims=True)
    for sj, vj in zip(s[1:], v[1:]):
        m_new = np.maximum(m, sj.max(1, keepdims=True))
        c = np.exp(m - m_new)
        o, l = o * c + np.exp(sj - m_new) @ vj, l * c + np.exp(sj - m_new).sum(1, keepdims=True)
        m = m_new
    assert np.allclose(o, sum(np.exp(sj - m) @ vj for sj, vj in zip(s, v)))
    assert np.allclose(l, sum(np.exp(sj - m).sum(1, keepdims=True) for sj in s))
    full = np.concatenate(s, 1)
    p = np.exp(full - full.max(1, keepdims=True))
    assert np.allclose(o / l, (p / p.sum(1, keepdims=True)) @ np.concatenate(v, 0))


# ------------------------------------------------------------------ the rewrite keeps values

@pytest.mark.parametrize("name", CASES + TWINS)
def test_the_rewrite_keeps_every_output(name):
    c = _case(name)
    _outputs_unchanged_by_the_rewrite(import_jax(c.seq, c.dist, c.args, name))


@pytest.mark.parametrize("name", CASES)
def test_no_transient_running_max_is_left_outside_the_max_chain(name):
    """After the rewrite, the running maxima rescaled away (every m_j but the last) feed
    only the elementwise maxima that build the last: each exponential is shifted by the
    final max, as the sequential program's is."""
    c = _case(name)
    problem = import_jax(c.seq, c.dist, c.args, name)
    rewrite(problem)
    analysis = ShiftAnalysis(problem.dist)
    assert not analysis.transient, "a rescale factor is still live"
    final = {k for f in analysis.forms.values() for k, _ in f.shift.coefs}
    assert len(final) == 1, final     # every exponential is shifted by the one final max
    readers = {op.kind for op in problem.dist.ops if op.kind != "exp" for i in op.inputs
               if i in final}
    assert readers <= {"broadcast_in_dim", "reshape"}, readers


def test_the_rewrite_leaves_a_program_without_rescales_alone():
    problem = import_jax(_example().causal_seq, _example()._dist(_example().ring_causal), _example()._args())
    assert not shift_free_merges(problem.seq, problem.ids)


# ------------------------------------------------------------------ flash decoding: one rank, two key blocks

H, T, DH = 2, 8, 4


def _heads(f):
    mesh = dlverify.host_mesh((2,), ("tp",))
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("tp"),) * 3, out_specs=P("tp")))


def _reference(q, k, v):
    s = jnp.einsum("hqd,hkd->hqk", q, k)
    p = jnp.exp(s - lax.stop_gradient(s.max(-1, keepdims=True)))
    return jnp.einsum("hqk,hkd->hqd", p, v) / p.sum(-1, keepdims=True)


def _two_blocks(rescale: bool):
    """Heads split over 'tp'; each rank merges the keys in two blocks of T/2 with an
    online softmax (a batch dim in front: the statistics are [heads, queries, 1])."""
    def f(q, k, v):
        o = l = m = None
        for blk in range(2):
            kb, vb = k[:, blk * T // 2:(blk + 1) * T // 2], v[:, blk * T // 2:(blk + 1) * T // 2]
            s = jnp.einsum("hqd,hkd->hqk", q, kb)
            m_blk = lax.stop_gradient(s.max(-1, keepdims=True))
            if m is None:
                m, p = m_blk, jnp.exp(s - m_blk)
                o, l = jnp.einsum("hqk,hkd->hqd", p, vb), p.sum(-1, keepdims=True)
                continue
            m_new = jnp.maximum(m, m_blk)
            c = jnp.exp(m - m_new) if rescale else jnp.ones_like(m)
            p = jnp.exp(s - m_new)
            o = o * c + jnp.einsum("hqk,hkd->hqd", p, vb)
            l = l * c + p.sum(-1, keepdims=True)
            m = m_new
        return o / l
    return f


ARGS = tuple(jax.ShapeDtypeStruct((H, T, DH), jnp.float32) for _ in range(3))


def test_flash_decoding_blocks_on_one_rank_verify():
    _outputs_unchanged_by_the_rewrite(import_jax(_reference, _heads(_two_blocks(True)), ARGS))
    res = verify_jax(_reference, _heads(_two_blocks(True)), *ARGS, engine="clingo")
    assert res.verified, [(f.op, f.line, f.message) for f in res.failures[:2]]
    _views_hold(res)


def test_flash_decoding_without_the_rescale_is_not_verified():
    _outputs_unchanged_by_the_rewrite(import_jax(_reference, _heads(_two_blocks(False)), ARGS))
    assert not verify_jax(_reference, _heads(_two_blocks(False)), *ARGS, engine="clingo").verified


# ------------------------------------------------------------------ cyclic ranges (ring_ranges.dl)

N, ROWS, COLS = 4, 16, 3
TO_NEXT = [(r, (r + 1) % N) for r in range(N)]
X = (jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32),)


def _ring(f):
    mesh = dlverify.host_mesh((N,), ("ring",))
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("ring"),), out_specs=P(), check_vma=False))


def _visiting(merge, reduce, steps=N - 1):
    """The blocks travel; each rank merges what it holds: blocks r, r-1, ... (wrapping)."""
    def f(x):
        acc = reduce(x)
        for _ in range(steps):
            x = lax.ppermute(x, "ring", TO_NEXT)
            acc = merge(acc, reduce(x))
        return acc
    return f


def _accumulating(x):
    """The partial sums travel (the K/V cotangents of ring attention's backward): rank r
    adds its block to what rank r-1 sends, N-1 times."""
    own = x.sum(0)
    acc = own
    for _ in range(N - 1):
        acc = lax.ppermute(acc, "ring", TO_NEXT) + own
    return acc


RING_CORRECT = {
    "sum_of_visiting_blocks": (lambda x: x.sum(0), _visiting(jnp.add, lambda x: x.sum(0))),
    "max_of_visiting_blocks": (lambda x: x.max(0), _visiting(jnp.maximum, lambda x: x.max(0))),
    "accumulators_passed_on": (lambda x: x.sum(0), _accumulating),
}
def _two_blocks_then_psum(x):
    """Rank r sums blocks r and r-1 (rank 0: 0 and 3, a wrapped range), then a psum:
    every block counted twice."""
    return lax.psum(_visiting(jnp.add, lambda x: x.sum(0), steps=1)(x), "ring")


RING_BUGGY = {
    "wrapped_ranges_summed_over_the_ranks": (lambda x: x.sum(0), _two_blocks_then_psum),
    "a_block_missing": (lambda x: x.sum(0), _visiting(jnp.add, lambda x: x.sum(0), steps=N - 2)),
    "a_block_twice": (lambda x: x.sum(0), _visiting(jnp.add, lambda x: x.sum(0), steps=N)),
    "a_max_block_missing": (lambda x: x.max(0), _visiting(jnp.maximum, lambda x: x.max(0), steps=N - 2)),
}


@pytest.mark.parametrize("name", sorted(RING_CORRECT))
def test_ranges_that_wrap_around_the_ring_complete(name):
    seq, local = RING_CORRECT[name]
    res = verify_jax(seq, _ring(local), *X, engine="clingo")
    assert res.verified, [(f.op, f.line, f.message) for f in res.failures[:2]]
    _views_hold(res)


@pytest.mark.parametrize("name", sorted(RING_BUGGY))
def test_a_ring_that_skips_or_repeats_a_block_is_not_verified(name):
    seq, local = RING_BUGGY[name]
    res = verify_jax(seq, _ring(local), *X, engine="clingo")
    assert not res.verified
    _views_hold(res)


# ------------------------------------------------------------------ the example

@pytest.mark.parametrize("name", CASES)
def test_ring_attention_cases_verify(name, example_runs):
    verified_example(example_runs, EXAMPLE, name)


@pytest.mark.parametrize("name", TWINS)
def test_ring_attention_twins_are_located_at_their_bug_line(name, example_runs):
    res = located_twin(example_runs, EXAMPLE, name)
    if name in MERGE_TWINS:   # the running max is merged, not missing a pmax: no such advice
        assert "pmax" not in res.failures[0].message, res.failures[0].message

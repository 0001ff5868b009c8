"""Where a sum of local means that nothing divides is reported on a compiled module
(dlverify/diagnosis_origin.unscaled_sum): at the collective, the line the division
belongs after. Each rank's mean over its own rows is DP times its share of the
global mean, so the psum is DP times the sequential value; no op after it makes the
factor (earliest_origin finds none, and the collective only completes terms that
already carry it), and no division rescales it (rescaled_sums finds none).

- The compiled module puts other ops between the all-reduce and the output: XLA
  splits a gradient's all-reduce into the column blocks of the concatenate the
  sequential module still has, and joins them again; those ops carry the metadata
  of the forward's concatenate, a line unrelated to the factor.
- A nonlinear op reading the undivided sum is where the relation is finally lost,
  but the division is missing after the collective.
- Not when a later collective changes the factor (a pmean of a gradient autodiff
  already summed: its psum multiplies by DP, its division cancels only that): the
  factor is fixed after the first collective, by the wrong amount.

Each pair has a correct twin that verifies: the diagnosis never changes a verdict."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from conftest import bug_line
from jax.sharding import PartitionSpec as P
from test_diagnosis_compiled import DP, ROWS, _dp, _located, rms_ok, rms_seq

f32 = jnp.float32


def _frames(f) -> set[int]:
    return {fr.line for fr in f.frames if fr.file.endswith("test_diagnosis_scaled.py")}


# --------------------------------- a gradient of a split projection, summed only

def _loss(x, w):   # the mean over the rows this program holds
    a, b = jnp.split(x @ w, 2, axis=1)
    return jnp.mean(jnp.tanh(a) * b)


def grad_seq(x, w):
    return jax.grad(_loss, argnums=1)(x, w)


def grad_ok(x, w):
    return jax.lax.psum(jax.grad(_loss, argnums=1)(x, w), "dp") / DP


def grad_bug(x, w):
    g = jax.grad(_loss, argnums=1)(x, w)
    return jax.lax.psum(g, "dp")  # BUG: the sum of the ranks' local-mean gradients needs / DP


GRAD_ARGS = (jax.ShapeDtypeStruct((8, 4), f32), jax.ShapeDtypeStruct((4, 6), f32))
GRAD_SPECS = (P("dp"), P())   # (w's gradient psum'd by hand: check_vma off)


def _reported_at_the_collective(tmp_path, seq, ok, bug, args):
    """`ok` verifies; `bug`'s first failure is the scale at its psum, the BUG line."""
    assert _located(tmp_path, seq, ok, args)[0].verified
    res, first = _located(tmp_path, seq, bug, args)
    assert not res.verified
    assert first.kind == "scale-mismatch", [(f.op, f.kind, f.message[:160]) for f in res.failures]
    assert bug_line(bug) in _frames(first), (first.op, first.message)
    assert first.op == "all_reduce" and "nothing after it divides the sum" in first.message


def test_an_undivided_sum_of_local_means_is_reported_at_the_collective(tmp_path):
    _reported_at_the_collective(tmp_path, grad_seq, _dp(grad_ok, GRAD_SPECS, P(), check_vma=False),
                                _dp(grad_bug, GRAD_SPECS, P(), check_vma=False), GRAD_ARGS)


# ------------------------------------- a nonlinear op reading the undivided sum

def rms_bug(x):
    g = jax.lax.psum(jnp.mean(x, axis=0), "dp")  # BUG: the mean of the means needs / DP
    return jnp.sqrt(0.5 * g * g + 1.0)


def test_a_nonlinear_op_reading_an_undivided_sum_is_reported_at_the_collective(tmp_path):
    _reported_at_the_collective(tmp_path, rms_seq, _dp(rms_ok, (P("dp"),), P()),
                                _dp(rms_bug, (P("dp"),), P()), ROWS)


# -------------------- a later collective changes the factor: the first is not blamed

def _sq_loss(w, x):
    return jnp.mean((x @ w) ** 2)


def pmean_bug(w, x):
    g = jax.grad(_sq_loss)(w, x)   # w is invariant: autodiff psums the cotangent over 'dp'
    return jax.lax.pmean(g, "dp")  # BUG: g is already summed over 'dp'; it needs / DP


def pmean_ok(w, x):
    return jax.grad(_sq_loss)(w, x) / DP


def test_a_factor_a_later_collective_changes_is_not_blamed_on_the_first(tmp_path):
    args = (jax.ShapeDtypeStruct((4, 3), f32), jax.ShapeDtypeStruct((8, 4), f32))
    seq = jax.grad(_sq_loss)
    assert _located(tmp_path, seq, _dp(pmean_ok, (P(), P("dp")), P()), args)[0].verified
    res, first = _located(tmp_path, seq, _dp(pmean_bug, (P(), P("dp")), P()), args)
    assert not res.verified
    assert first.kind == "scale-mismatch", [(f.op, f.kind, f.message[:160]) for f in res.failures]
    assert bug_line(pmean_bug) in _frames(first), (first.op, first.message)
    assert "nothing after it divides the sum" not in first.message


# --------------- a value reduced twice, read by a nonlinear op (diagnosis_origin.resummed_whole)

def pmean_tanh_bug(w, x):
    g = jax.grad(_sq_loss)(w, x)   # w is invariant: autodiff psums the cotangent over 'dp'
    g = jax.lax.pmean(g, "dp")  # BUG: sums the summed gradient again (DP times too large)
    return jnp.tanh(g)


def pmean_tanh_ok(w, x):
    return jnp.tanh(jax.grad(_sq_loss)(w, x) / DP)


def pmean_tanh_seq(w, x):
    return jnp.tanh(jax.grad(_sq_loss)(w, x))


def test_a_psum_of_a_value_every_rank_holds_whole_is_reported_at_that_psum():
    """The nonlinear op reads DP x the gradient: not a sum of local means left undivided
    (the first psum is right) but a second psum, of a value every rank already holds."""
    from dlverify.api import verify_jax
    args = (jax.ShapeDtypeStruct((4, 3), f32), jax.ShapeDtypeStruct((8, 4), f32))
    assert verify_jax(pmean_tanh_seq, _dp(pmean_tanh_ok, (P(), P("dp")), P()), *args).verified
    res = verify_jax(pmean_tanh_seq, _dp(pmean_tanh_bug, (P(), P("dp")), P()), *args)
    assert not res.verified
    first = res.failures[0]
    assert first.kind == "scale-mismatch" and first.op == "all_reduce", \
        [(f.op, f.kind, f.message[:160]) for f in res.failures]
    assert bug_line(pmean_tanh_bug) in _frames(first), (first.op, first.message)
    assert "already holds whole" in first.message

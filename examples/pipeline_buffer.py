"""A GPipe pipeline schedule that writes its outputs into a preallocated buffer,
as the JAX shard_map pipelining tutorial and praxis/MaxText-style GPipe do: 4
stages over the mesh axis 'pp', one layer per stage, 4 micro-batches.

At every time step each stage applies its layer to the state it holds; stage 0
first takes the next micro-batch; the states then move one stage on (ppermute).
From step S - 1 on, the last stage holds the finished micro-batch t - (S - 1)
and writes it into its slot of an output buffer of zeros; every other stage
writes back what the slot already holds (where(stage == S - 1, state,
outputs[i])), so its buffer stays zeros. One psum over 'pp' gives every rank
the buffer.

The schedule is written four ways: unrolled with `.at[i].set`, unrolled with
`lax.dynamic_update_slice` at static offsets, as a `lax.fori_loop` whose step
is the loop counter (micro-batches read with `lax.dynamic_index_in_dim`, the
slot `t - (S - 1)` computed from the counter and written by
`dynamic_update_slice`), and as a `lax.scan` over the steps writing with
`.at[i].set` (a scatter at a traced slot). The loops are unrolled (their
counters then known on every step) before the rules run: the sequential program
stacks its outputs, or (buffer_fori_loop_both) is a fori_loop of another length
writing its own buffer, so no loop pairs for induction.

dlverify folds the stage predicates per rank (datalog/select.dl); a
dynamic_update_slice writing back the rows it read leaves its operand
unchanged, and one writing rows next to those a buffer already holds of a
sequential tensor (zero elsewhere) holds their union (datalog/update.dl);
the psum sums the last stage's buffer with zeros (datalog/holders.dl).

Buggy twins: the slot is off by one; the psum is missing; the buffer is taken
from stage 0.
"""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

import dlverify

STAGES, MICRO, BATCH, WIDTH = 4, 4, 2, 8
STEPS = MICRO + STAGES - 1


def _args():
    f32 = jnp.float32
    return (
        jax.ShapeDtypeStruct((STAGES, WIDTH, WIDTH), f32),   # one layer's weight per stage
        jax.ShapeDtypeStruct((MICRO, BATCH, WIDTH), f32),    # the micro-batches
    )


def _dist(local_fn):
    mesh = dlverify.host_mesh((STAGES,), ("pp",))
    return jax.jit(jax.shard_map(local_fn, mesh=mesh, in_specs=(P("pp"), P()), out_specs=P(),
                                 check_vma=False))


def layer(w, x):
    return jnp.tanh(x @ w)


def pipeline_seq(w, xs):
    outs = []
    for m in range(MICRO):
        x = xs[m]
        for s in range(STAGES):
            x = layer(w[s], x)
        outs.append(x)
    return jnp.stack(outs)


def pipeline_seq_loop(w, xs):
    """The sequential program as a fori_loop over the micro-batches writing its own buffer."""
    def body(m, outs):
        x = lax.dynamic_index_in_dim(xs, m, keepdims=False)
        for s in range(STAGES):
            x = layer(w[s], x)
        return lax.dynamic_update_slice(outs, x[None], (m, 0, 0))
    return lax.fori_loop(0, MICRO, body, jnp.zeros((MICRO, BATCH, WIDTH), jnp.float32))


NEXT = [(i, (i + 1) % STAGES) for i in range(STAGES)]


def _step(w, xs, stage, t, state):
    """One time step: stage 0 takes micro-batch t (unrolled: t is a Python int)."""
    if t < MICRO:
        state = jnp.where(stage == 0, xs[t], state)
    return layer(w[0], state)


def buffer_at_set(w, xs):
    stage = lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outputs = jnp.zeros((MICRO, BATCH, WIDTH), jnp.float32)
    for t in range(STEPS):
        state = _step(w, xs, stage, t, state)
        if t >= STAGES - 1:
            i = t - (STAGES - 1)
            outputs = outputs.at[i].set(jnp.where(stage == STAGES - 1, state, outputs[i]))
        state = lax.ppermute(state, "pp", NEXT)
    return lax.psum(outputs, "pp")


@dlverify.case
def buffer_unrolled_at_set():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_at_set), args=_args(), expect="verified",
        description="GPipe writing finished micro-batches into a buffer with .at[i].set, psum'ed")


def buffer_dus(w, xs):
    stage = lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outputs = jnp.zeros((MICRO, BATCH, WIDTH), jnp.float32)
    for t in range(STEPS):
        state = _step(w, xs, stage, t, state)
        if t >= STAGES - 1:
            done = jnp.where(stage == STAGES - 1, state, 0.0)
            outputs = lax.dynamic_update_slice(outputs, done[None], (t - (STAGES - 1), 0, 0))
        state = lax.ppermute(state, "pp", NEXT)
    return lax.psum(outputs, "pp")


@dlverify.case
def buffer_unrolled_dus():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_dus), args=_args(), expect="verified",
        description="GPipe writing finished micro-batches (zeros off the last stage) with "
                    "dynamic_update_slice at static offsets, psum'ed")


def _loop_body(w, xs, stage, slot_shift):
    """The fori_loop body: the step is the loop counter t; the slot written is
    t - (S - 1) + slot_shift (clamped to the buffer), by the last stage once t >= S - 1."""
    def body(t, carry):
        state, outputs = carry
        x_t = lax.dynamic_index_in_dim(xs, jnp.minimum(t, MICRO - 1), keepdims=False)
        state = jnp.where((stage == 0) & (t < MICRO), x_t, state)
        state = layer(w[0], state)
        i = jnp.clip(t - (STAGES - 1) + slot_shift, 0, MICRO - 1)
        done = (stage == STAGES - 1) & (t >= STAGES - 1)
        slot = lax.dynamic_index_in_dim(outputs, i, keepdims=True)
        outputs = lax.dynamic_update_slice(outputs, jnp.where(done, state[None], slot), (i, 0, 0))
        return lax.ppermute(state, "pp", NEXT), outputs
    return body


def buffer_fori(w, xs):
    stage = lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outputs = jnp.zeros((MICRO, BATCH, WIDTH), jnp.float32)
    _, outputs = lax.fori_loop(0, STEPS, _loop_body(w, xs, stage, 0), (state, outputs))
    return lax.psum(outputs, "pp")


@dlverify.case
def buffer_fori_loop():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_fori), args=_args(), expect="verified",
        description="GPipe as a fori_loop: micro-batch and buffer slot from the loop counter")


@dlverify.case
def buffer_fori_loop_both():
    return dlverify.Case(
        seq=pipeline_seq_loop, dist=_dist(buffer_fori), args=_args(), expect="verified",
        description="GPipe fori_loop against a sequential fori_loop writing its own buffer")


def buffer_scan(w, xs):
    stage = lax.axis_index("pp")

    def body(carry, t):
        state, outputs = carry
        x_t = lax.dynamic_index_in_dim(xs, jnp.minimum(t, MICRO - 1), keepdims=False)
        state = layer(w[0], jnp.where((stage == 0) & (t < MICRO), x_t, state))
        i = jnp.maximum(t - (STAGES - 1), 0)
        done = (stage == STAGES - 1) & (t >= STAGES - 1)
        outputs = outputs.at[i].set(jnp.where(done, state, outputs[i]))
        return (lax.ppermute(state, "pp", NEXT), outputs), None

    init = (jnp.zeros((BATCH, WIDTH), jnp.float32), jnp.zeros((MICRO, BATCH, WIDTH), jnp.float32))
    (_, outputs), _ = lax.scan(body, init, jnp.arange(STEPS))
    return lax.psum(outputs, "pp")


@dlverify.case
def buffer_scan_at_set():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_scan), args=_args(), expect="verified",
        description="GPipe as a lax.scan over the steps: .at[i].set at a slot from the step")


# --------------------------------------------------------------- buggy twins

def buffer_at_set_off_by_one(w, xs):
    stage = lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outputs = jnp.zeros((MICRO, BATCH, WIDTH), jnp.float32)
    for t in range(STEPS):
        state = _step(w, xs, stage, t, state)
        if t >= STAGES - 1:
            i = t - (STAGES - 1)
            j = (i + 1) % MICRO
            outputs = outputs.at[j].set(jnp.where(stage == STAGES - 1, state, outputs[j]))  # BUG: slot i + 1
        state = lax.ppermute(state, "pp", NEXT)
    return lax.psum(outputs, "pp")


@dlverify.case
def buffer_bug_wrong_slot():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_at_set_off_by_one), args=_args(), expect="bug",
        description="GPipe writing micro-batch i into slot i + 1 of the buffer")


def buffer_dus_no_psum(w, xs):
    stage = lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outputs = jnp.zeros((MICRO, BATCH, WIDTH), jnp.float32)
    for t in range(STEPS):
        state = _step(w, xs, stage, t, state)
        if t >= STAGES - 1:
            done = jnp.where(stage == STAGES - 1, state, 0.0)
            outputs = lax.dynamic_update_slice(outputs, done[None], (t - (STAGES - 1), 0, 0))
        state = lax.ppermute(state, "pp", NEXT)
    return outputs.reshape(MICRO * BATCH, WIDTH)  # BUG: only the last stage holds the outputs; no psum


def pipeline_seq_batch(w, xs):
    """The sequential outputs with the micro-batches merged back into one batch."""
    return pipeline_seq(w, xs).reshape(MICRO * BATCH, WIDTH)


@dlverify.case
def buffer_bug_missing_psum():
    return dlverify.Case(
        seq=pipeline_seq_batch, dist=_dist(buffer_dus_no_psum), args=_args(), expect="bug",
        description="GPipe returning the buffer, merged into one batch, without the psum that "
                    "shares the last stage's")


def buffer_fori_stage0(w, xs):
    stage = lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outputs = jnp.zeros((MICRO, BATCH, WIDTH), jnp.float32)
    _, outputs = lax.fori_loop(0, STEPS, _loop_body(w, xs, stage, 0), (state, outputs))
    return lax.psum(jnp.where(stage == 0, outputs, 0.0), "pp")  # BUG: stage 0's buffer, not the last stage's


@dlverify.case
def buffer_bug_stage0_buffer():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_fori_stage0), args=_args(), expect="bug",
        description="GPipe fori_loop sharing stage 0's buffer (zeros) instead of the last stage's")

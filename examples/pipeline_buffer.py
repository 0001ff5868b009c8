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

The schedule is written five ways: (1) unrolled with `.at[i].set`; (2) unrolled
writing a slot at every step, `(t - (S - 1)) % M` as in the JAX tutorial, so that
the warm-up's states land in slots the finished micro-batches overwrite later;
(3) unrolled with `lax.dynamic_update_slice` at static offsets; (4) as a
`lax.fori_loop` whose step is the loop counter (micro-batches read with
`lax.dynamic_index_in_dim`, the slot `t - (S - 1)` computed from the counter and
written by `dynamic_update_slice`); (5) as a `lax.scan` over the steps writing
with `.at[i].set` (a scatter at a traced slot). The loops are unrolled (their
counters then known on every step) before the rules run: the sequential program
stacks its outputs, or (buffer_fori_loop_both) is a fori_loop of another length
writing its own buffer, so no loop pairs for induction.

dlverify folds the stage predicates per rank (datalog/select.dl), so the other
stages write back the zeros they read; on the last stage a dynamic_update_slice
writing rows next to those a buffer of zeros already holds of a sequential tensor
holds their union, and a buffer whose every slot was last written with its row of
a sequential tensor is that tensor, whatever was written before (datalog/update.dl);
the psum sums the last stage's buffer with zeros (datalog/holders.dl).

Buggy twins: the slot is off by one; the psum is missing; the buffer is taken
from stage 0.

The layer, the sequential program, the arguments and the mesh are those of
examples/pipeline_gpipe.py.
"""
import jax.numpy as jnp
from jax import lax
from pipeline_gpipe import BATCH, MICRO, NEXT, STAGES, WIDTH, _args, _dist, layer, pipeline_seq

import dlverify

STEPS = MICRO + STAGES - 1


def pipeline_seq_loop(w, xs):
    """The sequential program as a fori_loop over the micro-batches writing its own buffer."""
    def body(m, outs):
        x = lax.dynamic_index_in_dim(xs, m, keepdims=False)
        for s in range(STAGES):
            x = layer(w[s], x)
        return lax.dynamic_update_slice(outs, x[None], (m, 0, 0))
    return lax.fori_loop(0, MICRO, body, jnp.zeros((MICRO, BATCH, WIDTH), jnp.float32))


def finished(t):
    """The slot of the micro-batch the last stage finishes at step t (None: the warm-up)."""
    return t - (STAGES - 1) if t >= STAGES - 1 else None


def set_slot(outputs, i, stage, state):
    """The last stage writes its state into slot i; the others write back what it holds."""
    return outputs.at[i].set(jnp.where(stage == STAGES - 1, state, outputs[i]))


def update_slot(outputs, i, stage, state):
    """The last stage writes its state into slot i; the others write zeros."""
    done = jnp.where(stage == STAGES - 1, state, 0.0)
    return lax.dynamic_update_slice(outputs, done[None], (i, 0, 0))


def unrolled(w, xs, slot, write):
    """The schedule unrolled: at step t, stage 0 takes micro-batch t, every stage applies
    its layer, the buffer's slot(t) is written (none when it is None), the states move on.
    Returns each rank's buffer."""
    stage = lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outputs = jnp.zeros_like(xs)
    for t in range(STEPS):
        if t < MICRO:
            state = jnp.where(stage == 0, xs[t], state)
        state = layer(w[0], state)
        if slot(t) is not None:
            outputs = write(outputs, slot(t), stage, state)
        state = lax.ppermute(state, "pp", NEXT)
    return outputs


def buffer_at_set(w, xs):
    return lax.psum(unrolled(w, xs, finished, set_slot), "pp")


@dlverify.case
def buffer_unrolled_at_set():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_at_set), args=_args(), expect="verified",
        description="GPipe writing finished micro-batches into a buffer with .at[i].set, psum'ed")


def buffer_modulo(w, xs):
    # a slot at every step: during the warm-up, slots written again later
    return lax.psum(unrolled(w, xs, lambda t: (t - (STAGES - 1)) % MICRO, set_slot), "pp")


@dlverify.case
def buffer_unrolled_modulo():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_modulo), args=_args(), expect="verified",
        description="GPipe writing a slot at every step, (t - S + 1) % M: the warm-up's states "
                    "overwritten by the finished micro-batches")


def buffer_dus(w, xs):
    return lax.psum(unrolled(w, xs, finished, update_slot), "pp")


@dlverify.case
def buffer_unrolled_dus():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_dus), args=_args(), expect="verified",
        description="GPipe writing finished micro-batches (zeros off the last stage) with "
                    "dynamic_update_slice at static offsets, psum'ed")


def fori(w, xs, slot_shift=0):
    """The schedule as a fori_loop; the step is the loop counter t and the slot written
    t - (S - 1) + slot_shift (clamped to the buffer), by the last stage once t >= S - 1.
    Returns each rank's buffer."""
    stage = lax.axis_index("pp")

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

    init = (jnp.zeros((BATCH, WIDTH), jnp.float32), jnp.zeros_like(xs))
    return lax.fori_loop(0, STEPS, body, init)[1]


def buffer_fori(w, xs):
    return lax.psum(fori(w, xs), "pp")


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
    one_past = lambda t: None if t < STAGES - 1 else (finished(t) + 1) % MICRO  # noqa: E731
    outputs = unrolled(w, xs, one_past, set_slot)  # BUG: micro-batch i written into slot i + 1
    return lax.psum(outputs, "pp")


@dlverify.case
def buffer_bug_wrong_slot():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_at_set_off_by_one), args=_args(), expect="bug",
        description="GPipe writing micro-batch i into slot i + 1 of the buffer")


def buffer_dus_no_psum(w, xs):
    outputs = unrolled(w, xs, finished, update_slot)
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
    return lax.psum(jnp.where(stage == 0, fori(w, xs), 0.0), "pp")  # BUG: stage 0's buffer (zeros)


@dlverify.case
def buffer_bug_stage0_buffer():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(buffer_fori_stage0), args=_args(), expect="bug",
        description="GPipe fori_loop sharing stage 0's buffer (zeros) instead of the last stage's")

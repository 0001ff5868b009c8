"""A GPipe pipeline schedule in shard_map: 4 stages over the mesh axis 'pp',
one layer per stage (the stacked weights sharded on the layer dim), 4
micro-batches.

At every time step each stage applies its layer to the state it holds; stage 0
first takes the next micro-batch (where(stage == 0, x[t], state)); the states
then move one stage on (ppermute). From step S - 1 on, the last stage holds a
finished micro-batch: it is kept there and zeros elsewhere
(where(stage == S - 1, state, 0)), the kept outputs are stacked, and one psum
over 'pp' gives every rank the outputs. During the warm-up the other stages
compute on zeros; those values never reach an output.

dlverify folds the stage predicates per rank (a select_n whose index is known
on each rank, datalog/select.dl) and sums a value held by one member of a group
with zeros from the others (datalog/holders.dl).

Buggy twins: the psum that shares the last stage's outputs is missing, or is
a pmean.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify

STAGES, MICRO, BATCH, WIDTH = 4, 4, 2, 8


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


NEXT = [(i, (i + 1) % STAGES) for i in range(STAGES)]


def gpipe_local(w, xs):
    stage = jax.lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outs = []
    for t in range(MICRO + STAGES - 1):
        if t < MICRO:
            state = jnp.where(stage == 0, xs[t], state)      # stage 0 takes micro-batch t
        state = layer(w[0], state)
        if t >= STAGES - 1:
            outs.append(jnp.where(stage == STAGES - 1, state, 0.0))  # finished on the last stage
        state = jax.lax.ppermute(state, "pp", NEXT)
    return jax.lax.psum(jnp.stack(outs), "pp")


@dlverify.case
def gpipe_forward():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(gpipe_local), args=_args(), expect="verified",
        description="GPipe schedule, 4 stages x 4 micro-batches, outputs kept on the last stage and psum'ed")


# --------------------------------------------------------------- buggy twins
# (Found but located at the next layer call rather than at their line, so not
# shipped as twins: outputs kept on the first stage, the ring shifted backwards.)

def gpipe_local_no_psum(w, xs):
    stage = jax.lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outs = []
    for t in range(MICRO + STAGES - 1):
        if t < MICRO:
            state = jnp.where(stage == 0, xs[t], state)
        state = layer(w[0], state)
        if t >= STAGES - 1:
            outs.append(jnp.where(stage == STAGES - 1, state, 0.0))
        state = jax.lax.ppermute(state, "pp", NEXT)
    return jnp.stack(outs)  # BUG: only the last stage holds the outputs; no psum over 'pp'


@dlverify.case
def gpipe_bug_missing_psum():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(gpipe_local_no_psum), args=_args(), expect="bug",
        description="GPipe returning the masked outputs without the psum that shares them")


def gpipe_local_pmean(w, xs):
    stage = jax.lax.axis_index("pp")
    state = jnp.zeros((BATCH, WIDTH), jnp.float32)
    outs = []
    for t in range(MICRO + STAGES - 1):
        if t < MICRO:
            state = jnp.where(stage == 0, xs[t], state)
        state = layer(w[0], state)
        if t >= STAGES - 1:
            outs.append(jnp.where(stage == STAGES - 1, state, 0.0))
        state = jax.lax.ppermute(state, "pp", NEXT)
    return jax.lax.pmean(jnp.stack(outs), "pp")  # BUG: a mean over the stages divides the outputs by 4


@dlverify.case
def gpipe_bug_pmean():
    return dlverify.Case(
        seq=pipeline_seq, dist=_dist(gpipe_local_pmean), args=_args(), expect="bug",
        description="GPipe sharing the masked outputs with a pmean instead of a psum")

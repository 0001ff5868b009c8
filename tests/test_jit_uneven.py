"""`jax.jit` programs that XLA partitions over a dim the mesh does not divide: a
GPT-2 forward and training step whose logits are constrained to be sharded over a
vocabulary of 50 on 4 devices (the one-hot of the labels, the logits' max and sum over the padded
vocabulary blocks), and the padded one-hot in isolation (padded.dl's iota rule)."""
import sys
from pathlib import Path

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from rulekit import Tiny

import dlverify
from dlverify.api import verify_jax
from dlverify.ir import Mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))
import gpt2 as G  # noqa: E402


def _gpt2(vocab: int, train: bool):
    cfg = G.Config(vocab=vocab, layers=1)
    mesh = dlverify.host_mesh((4,), ("tp",))
    n = len(G.param_shapes(cfg))

    def logits_of(p, ids):
        return jax.lax.with_sharding_constraint(G.forward_seq(cfg, p, ids),
                                                NamedSharding(mesh, P(None, None, "tp")))

    def forward(*flat):
        p, ids, labels = G._unpack(cfg, flat)
        logits = logits_of(p, ids)
        return logits, G.xent(logits, labels, cfg.vocab)

    def loss(*flat):
        p, ids, labels = G._unpack(cfg, flat)
        return G.xent(logits_of(p, ids), labels, cfg.vocab)

    def train_step(*flat):
        value, grads = jax.value_and_grad(loss, argnums=tuple(range(n)))(*flat)
        return (value, *grads)
    jitted = jax.jit(train_step if train else forward,
                     in_shardings=tuple(NamedSharding(mesh, P()) for _ in range(n + 2)))
    return verify_jax(G.make_seq(cfg, train), jitted, *G.args(cfg))


def test_gpt2_logits_sharded_over_an_uneven_vocabulary_verify():
    res = _gpt2(50, train=False)
    assert res.verified, [f.message for f in res.failures[:3]]
    assert res.padded_views


def test_gpt2_training_step_sharded_over_an_uneven_vocabulary_verifies():
    """The backward pass too: XLA masks the one-hot gradient's padding between its
    negation and its sum (simplify's masked_neg), and on ranks whose block holds no
    padding the mask is true throughout (padded.dl keeps the whole block)."""
    res = _gpt2(50, train=True)
    assert res.verified, [f.message for f in res.failures[:3]]
    assert res.padded_views


def _one_hot_sum(shift_extra: int):
    """sum over a vocabulary of 10 of where(ids == v, x, 0), split over 4 ranks in
    blocks of 3: the distributed side compares ids with iota + rank * 3 (+ shift_extra)
    on its padded block of x, masks the padding as XLA does, and all-reduces."""
    t = Tiny(Mesh(("x",), (4,)))
    ids_s, ids_d = t.input((5,), dtype="int32")
    xs, xd = t.input((5, 10))
    i32 = lambda v: t.D.constant(np.asarray(v, np.int32), (), "int32")  # noqa: E731
    col_s = t.S.op("iota", [], (5, 10), "int32", {"dimension": 1})
    hit_s = t.S.op("eq", [t.S.op("broadcast_in_dim", [ids_s], (5, 10), "int32",
                                 {"broadcast_dimensions": (0,)}), col_s], (5, 10), "bool")
    ss = t.sop("reduce_sum", [t.sop("select_n", [hit_s, t.sconst(0.0, (5, 10)), xs], (5, 10))],
               (5,), axes=(1,))
    r = t.D.op("axis_index", [], (), "int32", {"axis": "x"})
    start = t.D.op("mul", [r, i32(3)], (), "int32")
    shifted = t.D.op("add", [start, i32(shift_extra)], (), "int32") if shift_extra else start
    b = lambda v: t.D.op("broadcast_in_dim", [v], (5, 3), "int32", {"broadcast_dimensions": ()})  # noqa: E731
    iota = t.D.op("iota", [], (5, 3), "int32", {"dimension": 1})
    col_d = t.D.op("add", [iota, b(shifted)], (5, 3), "int32")
    hit_d = t.D.op("eq", [t.D.op("broadcast_in_dim", [ids_d], (5, 3), "int32",
                                 {"broadcast_dimensions": (0,)}), col_d], (5, 3), "bool")
    xpad = t.dop("pad", [xd, t.dconst(0.0)], (5, 12), padding_config=((0, 0, 0), (0, 2, 0)))
    xblk = t.dop("dynamic_slice", [xpad, i32(0), start], (5, 3), slice_sizes=(5, 3))
    picked = t.dop("select_n", [hit_d, t.dconst(0.0, (5, 3)), xblk], (5, 3))
    valid = t.D.op("lt", [t.D.op("add", [iota, b(start)], (5, 3), "int32"), b(i32(10))], (5, 3), "bool")
    masked = t.dop("select_n", [valid, t.dconst(0.0, (5, 3)), picked], (5, 3))
    sd = t.dop("reduce_sum", [masked], (5,), axes=(1,))
    t.output(ss, t.dop("all_reduce", [sd], (5,), reducer="sum", groups=[[0, 1, 2, 3]]))
    return t.run().result


def test_a_one_hot_over_padded_vocabulary_blocks_verifies():
    assert _one_hot_sum(0).verified


def test_a_one_hot_shifted_off_its_block_does_not_verify():
    assert not _one_hot_sum(1).verified


def _xent_step(label_shift: int):
    """The gradient of the cross-entropy of h @ w over a vocabulary of 50, logits
    sharded over it on 4 devices; the distributed labels shifted by `label_shift`."""
    import jax.numpy as jnp
    mesh = dlverify.host_mesh((4,), ("tp",))

    def step(shift, constrain):
        def loss(h, w, labels):
            logits = h @ w
            if constrain:
                logits = jax.lax.with_sharding_constraint(logits,
                                                          NamedSharding(mesh, P(None, None, "tp")))
            return G.xent(logits, labels + shift, 50)

        def f(h, w, labels):
            value, grads = jax.value_and_grad(loss, argnums=(0, 1))(h, w, labels)
            return (value, *grads)
        return f
    jitted = jax.jit(step(label_shift, True),
                     in_shardings=tuple(NamedSharding(mesh, P()) for _ in range(3)))
    args = (jax.ShapeDtypeStruct((2, 8, 32), jnp.float32), jax.ShapeDtypeStruct((32, 50), jnp.float32),
            jax.ShapeDtypeStruct((2, 8), jnp.int32))
    return verify_jax(step(0, False), jitted, *args)


def test_a_cross_entropy_gradient_over_an_uneven_vocabulary_verifies():
    assert _xent_step(0).verified


def test_labels_shifted_in_the_distributed_gradient_do_not_verify():
    res = _xent_step(1)
    assert not res.verified
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if "labels + shift" in text)
    assert line in {fr.line for fr in res.failures[0].frames if fr.file == __file__}

"""splat_operands.dl: a constant holding one value everywhere, used at the same operand
position of a pair of ops whose other operand is related, is the other side's constant
of that value on any block of its size (the cotangent of a mean, a scalar, broadcast and
contracted with a one-hot matrix in the gradient of a lookup). `Tiny.run()` checks
every derived view numerically."""
from rulekit import Tiny

BATCHED = dict(lhs_contract=(1,), rhs_contract=(1,), lhs_batch=(0,), rhs_batch=(0,))


def _scaled_contraction(dist_value: float):
    """k * sum(x) pairs the scalar constants k; broadcast, k is contracted with x."""
    t = Tiny()
    xs, xd = t.input((8, 1, 4), (None, None, "x"))
    ks, kd = t.sconst(0.25), t.dconst(dist_value)
    ss = t.sop("reduce_sum", [xs], (), axes=(0, 1, 2))
    sd = t.dop("all_reduce", [t.dop("reduce_sum", [xd], (), axes=(0, 1, 2))], (), reducer="sum",
               groups=[[0, 1]])
    t.sop("mul", [ks, ss], ())
    t.dop("mul", [kd, sd], ())
    cs = t.sop("broadcast_in_dim", [ks], (8, 1), broadcast_dimensions=())
    cd = t.dop("broadcast_in_dim", [kd], (8, 1), broadcast_dimensions=())
    ys = t.sop("dot_general", [xs, cs], (8, 4), **BATCHED)
    yd = t.dop("dot_general", [xd, cd], (8, 2), **BATCHED)
    t.output(ys, yd, (None, "x"))
    return t, (ks, kd)


def test_an_equal_scalar_constant_is_related_and_its_broadcast_contracts():
    t, (ks, kd) = _scaled_contraction(0.25)
    out = t.run()
    assert out.result.verified, [f.message for f in out.result.failures]
    assert {v.offsets for v in out.views(ks, kd)} == {()}


def test_another_value_is_not_related():
    t, (ks, kd) = _scaled_contraction(0.5)
    out = t.run()
    assert not out.result.verified
    assert out.views(ks, kd) == []

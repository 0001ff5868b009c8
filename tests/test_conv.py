"""Convolutions expanded into pads, slices, dots and adds (dlverify/conv_lowering.py),
from jaxprs (`conv_general_dilated`) and from HLO (`convolution`, as written and as
XLA compiles it): the IR, run by the shared interpreter on random data, computes
what JAX computes, for strides, padding (also negative), both dilations, feature
and batch groups, layouts, tiled windows and gradients; malformed instructions are
one-line errors at their line."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from dlverify.errors import InputError, UnknownOpError
from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module
from dlverify.frontends.jaxpr import Ctx, walk
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator

RNG = np.random.default_rng(0)


def _arr(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _conv(**kw):
    return lambda x, w: lax.conv_general_dilated(x, w, **kw)


# (operand, kernel, attributes): every path of the expansion
CASES = {
    "same_1d": ((2, 3, 9), (4, 3, 3), dict(window_strides=(1,), padding="SAME")),
    "strided": ((2, 3, 9), (4, 3, 3), dict(window_strides=(2,), padding="VALID")),
    "kernel_dilation": ((2, 3, 9), (4, 3, 3), dict(window_strides=(2,), padding=((2, 1),),
                                                   rhs_dilation=(2,))),
    "negative_padding_lhs_dilation": ((2, 3, 9), (4, 3, 3), dict(
        window_strides=(1,), padding=((-1, 2),), lhs_dilation=(2,))),
    "feature_groups_2d": ((2, 4, 8, 8), (6, 2, 3, 3), dict(window_strides=(1, 1), padding="SAME",
                                                           feature_group_count=2)),
    "tiled_windows": ((2, 4, 8, 8), (6, 4, 2, 2), dict(window_strides=(2, 2), padding="VALID")),
    "tiled_windows_trimmed": ((2, 4, 9, 8), (6, 4, 2, 2), dict(window_strides=(2, 2),
                                                               padding="VALID")),
    "batch_groups": ((4, 3, 7), (6, 3, 2), dict(window_strides=(1,), padding="VALID",
                                                batch_group_count=2)),
    "causal_depthwise": ((2, 4, 10), (4, 1, 4), dict(window_strides=(1,), padding=((3, 0),),
                                                     feature_group_count=4)),
    # batch groups with fewer positions than taps (one dot per position, conv_lowering
    # ._positions): groups of 2 batches and 3 output features; of one batch and 2 features
    "batch_groups_fewer_positions": ((4, 3, 12), (6, 3, 10), dict(
        window_strides=(1,), padding="VALID", batch_group_count=2)),
    "batch_groups_of_one_batch": ((2, 3, 12), (4, 3, 10), dict(
        window_strides=(1,), padding="VALID", batch_group_count=2)),
    "fewer_positions_than_taps": ((2, 3, 12), (4, 3, 10), dict(window_strides=(1,),
                                                               padding="VALID")),
    "nhwc_strided": ((2, 8, 8, 3), (3, 3, 3, 5), dict(
        window_strides=(2, 2), padding="SAME", rhs_dilation=(1, 2),
        dimension_numbers=("NHWC", "HWIO", "NHWC"))),
}
GRADS = {
    "nhwc": (lambda x, w: lax.conv_general_dilated(x, w, (2, 2), "SAME",
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC")),
             (2, 8, 8, 3), (3, 3, 3, 5)),
    "same_2d": (lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME"),
                (2, 3, 6, 5), (4, 3, 3, 3)),
    "causal_depthwise": (lambda x, w: lax.conv_general_dilated(x, w, (1,), ((3, 0),),
                                                               feature_group_count=4),
                         (2, 4, 10), (4, 1, 4)),
}


def _grad_fn(f):
    return jax.grad(lambda x, w: jnp.sum(f(x, w) ** 2), argnums=(0, 1))


def _assert_like_jax(g: Graph, fn, args):
    vals = Interpreter(g, 1).run([[a] for a in args])
    want = jax.tree.leaves(jax.jit(fn)(*args))
    assert len(want) == len(g.outputs)
    for t, w in zip(g.outputs, want):
        np.testing.assert_allclose(np.asarray(vals[t][0], np.float64), np.asarray(w, np.float64),
                                   rtol=1e-4, atol=1e-4)


def _from_jaxpr(fn, args) -> Graph:
    closed = jax.make_jaxpr(fn)(*args)
    g = Graph("conv")
    b = GraphBuilder(g, IdAllocator())
    g.inputs = [b.tensor(np.shape(a), str(np.asarray(a).dtype)) for a in args]
    g.outputs = walk(Ctx(b, None, False), closed, g.inputs)
    return g


def _from_hlo(text: str) -> Graph:
    g, _ = hlo_to_graph(parse_hlo_module(text, "conv.hlo"), IdAllocator(), "g")
    return g


def _all():
    for name, (xs, ws, kw) in CASES.items():
        yield name, _conv(**kw), (_arr(*xs), _arr(*ws))
    for name, (f, xs, ws) in GRADS.items():
        yield f"grad_{name}", _grad_fn(f), (_arr(*xs), _arr(*ws))


ALL = list(_all())


@pytest.mark.parametrize("name,fn,args", ALL, ids=[a[0] for a in ALL])
def test_the_jaxpr_expansion_computes_the_convolution(name, fn, args):
    g = _from_jaxpr(fn, args)
    assert not any(op.kind.startswith("conv") for op in g.ops)
    _assert_like_jax(g, fn, args)


@pytest.mark.parametrize("compiled", [False, True], ids=["as_written", "compiled"])
@pytest.mark.parametrize("name,fn,args", ALL, ids=[a[0] for a in ALL])
def test_the_hlo_expansion_computes_the_convolution(name, fn, args, compiled):
    lowered = jax.jit(fn).lower(*args)
    text = lowered.compile().as_text() if compiled else lowered.as_text(dialect="hlo")
    _assert_like_jax(_from_hlo(text), fn, args)


def test_the_tiled_windows_are_one_dot():
    xs, ws, kw = CASES["tiled_windows"]
    g = _from_jaxpr(_conv(**kw), (_arr(*xs), _arr(*ws)))
    assert [op.kind for op in g.ops].count("dot_general") == 1


CONV = """HloModule m

ENTRY %main (x: f32[2,3,9], w: f32[4,3,3]) -> f32[2,4,9] {{
  %x = f32[2,3,9]{{2,1,0}} parameter(0)
  %w = f32[4,3,3]{{2,1,0}} parameter(1)
  ROOT %c = f32[2,4,9]{{2,1,0}} convolution(%x, %w), {attrs}
}}
"""


@pytest.mark.parametrize("attrs,error,words", [
    ("window={size=3 pad=1_1}, dim_labels=bf0_oi0->bf0", None, ()),
    ("window={size=3 pad=1_1}, dim_labels=bf0_oi0->b0f", InputError, ("does not fit",)),
    ("window={size=3 pad=1_1}, dim_labels=bfx_oi0->bf0", InputError, ("dim_labels",)),
    ("window={size=5 pad=2_2}, dim_labels=bf0_oi0->bf0", InputError, ("window size",)),
    ("window={size=3 pad=1_1 rhs_reversal=1}, dim_labels=bf0_oi0->bf0", UnknownOpError,
     ("rhs_reversal",)),
    ("window={size=3 pad=1_1 tilt=2}, dim_labels=bf0_oi0->bf0", InputError, ("tilt",)),
    ("window={size=3 pad=1_1}, dim_labels=bf0_oi0->bf0, feature_group_count=2", InputError,
     ("groups",)),
])
def test_malformed_convolutions_are_one_line_errors_at_their_line(attrs, error, words):
    text = CONV.format(attrs=attrs)
    if error is None:
        x, w = _arr(2, 3, 9), _arr(4, 3, 3)
        _assert_like_jax(_from_hlo(text), _conv(window_strides=(1,), padding="SAME"), (x, w))
        return
    with pytest.raises(error) as e:
        _from_hlo(text)
    msg = str(e.value)
    assert "conv.hlo:6" in msg and "\n" not in msg and all(w in msg for w in words), msg

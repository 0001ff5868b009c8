"""Pooling (`lax.reduce_window` with add, max, min: the `reduce_window_{sum,max,min}`
primitives, HLO `reduce-window`) expanded by dlverify/window_lowering.py: the IR,
run by the shared interpreter, computes what JAX computes (jaxpr, HLO as written
and compiled) for tiled windows, overlapping strided windows with SAME padding,
window and base dilation, and the average-pool gradient; tiled windows are one
reduction; a window that does not fit is a one-line error."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_conv import _assert_like_jax, _from_hlo, _from_jaxpr

from dlverify.errors import InputError
from dlverify.window_lowering import ReduceWindow, WindowSite, lower_reduce_window

X = np.random.default_rng(0).standard_normal((2, 3, 9, 8)).astype(np.float32)

POOLS = {
    "max_2x2": lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"),
    "max_3x3_s2_same": lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 1, 3, 3),
                                                   (1, 1, 2, 2), "SAME"),
    "avg_3x3_same": lambda a: lax.reduce_window(a, 0.0, lax.add, (1, 1, 3, 3), (1, 1, 1, 1),
                                                "SAME") / 9,
    "min_window_dilation": lambda a: lax.reduce_window(a, jnp.inf, lax.min, (1, 1, 2, 2),
                                                       (1, 1, 1, 1), "VALID",
                                                       window_dilation=(1, 1, 2, 2)),
    "sum_base_dilation": lambda a: lax.reduce_window(a, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 1, 1),
                                                     ((0, 0), (0, 0), (1, 1), (0, 1)),
                                                     base_dilation=(1, 1, 2, 1)),
    "avg_pool_gradient": jax.grad(lambda a: jnp.sum(lax.reduce_window(
        a, 0.0, lax.add, (1, 1, 3, 3), (1, 1, 2, 2), "SAME") ** 2)),
}


@pytest.mark.parametrize("name", list(POOLS))
def test_the_jaxpr_expansion_computes_the_pooling(name):
    g = _from_jaxpr(POOLS[name], (X,))
    assert not any(op.kind.startswith("reduce_window") for op in g.ops)
    _assert_like_jax(g, POOLS[name], (X,))


@pytest.mark.parametrize("compiled", [False, True], ids=["as_written", "compiled"])
@pytest.mark.parametrize("name", list(POOLS))
def test_the_hlo_expansion_computes_the_pooling(name, compiled):
    lowered = jax.jit(POOLS[name]).lower(X)
    text = lowered.compile().as_text() if compiled else lowered.as_text(dialect="hlo")
    _assert_like_jax(_from_hlo(text), POOLS[name], (X,))


def test_tiled_windows_are_one_reduction():
    g = _from_jaxpr(POOLS["max_2x2"], (X,))
    assert [op.kind for op in g.ops].count("reduce_max") == 1
    assert "max" not in [op.kind for op in g.ops]


def test_a_window_that_does_not_fit_is_an_error():
    site = WindowSite(lambda *a: 0, lambda v: 0)
    rw = ReduceWindow("max", (2, 2), (2, 2), ((0, 0), (0, 0)), (1, 1), (1, 1))
    with pytest.raises(InputError) as e:
        lower_reduce_window(site, 0, (4, 4), (3, 2), rw, 1, ("p.hlo", 7))
    assert "p.hlo:7" in str(e.value) and "does not fit" in str(e.value)


def test_integer_max_pooling_pads_with_the_least_integer():
    """The padding is the reducer's identity in the operand's dtype (iinfo.min for an
    int32 max: -inf is no int32), from jaxprs and HLO alike."""
    xi = np.random.default_rng(1).integers(-50, 50, size=(2, 7, 6)).astype(np.int32)

    def pool(a):
        return lax.reduce_window(a, np.iinfo(np.int32).min, lax.max, (1, 3, 3), (1, 2, 2), "SAME")
    _assert_like_jax(_from_jaxpr(pool, (xi,)), pool, (xi,))
    _assert_like_jax(_from_hlo(jax.jit(pool).lower(xi).as_text(dialect="hlo")), pool, (xi,))

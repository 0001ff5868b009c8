"""Max and min pooling's gradient (jaxpr `select_and_scatter_add`, HLO
`select-and-scatter`) expanded by dlverify/select_scatter.py: the IR, run by the
shared interpreter, computes what JAX and XLA compute (jaxpr, HLO as written) for tiled and overlapping windows, SAME padding, ties (the scan keeps
the first of equal maxima), and every select comparison against a reference scan
of XLA's semantics; a source that does not fit the windows is a one-line error."""
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from test_conv import _assert_like_jax, _from_hlo, _from_jaxpr

from dlverify.errors import InputError, UnknownOpError
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.select_scatter import SelectSite, SelectWindow, lower_select_and_scatter

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 9, 8)).astype(np.float32)
# few distinct values: most windows hold equal maxima (and minima)
TIES = RNG.integers(-2, 3, size=(2, 3, 9, 8)).astype(np.float32)


def _pool_grad(reducer, init, window, strides, padding):
    def loss(a):
        y = lax.reduce_window(a, init, reducer, window, strides, padding)
        return jnp.sum(y * jnp.arange(y.size, dtype=y.dtype).reshape(y.shape))
    return jax.grad(loss)


POOL_GRADS = {
    "max_2x2": _pool_grad(lax.max, -jnp.inf, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"),
    "max_3x3_s2_same": _pool_grad(lax.max, -jnp.inf, (1, 1, 3, 3), (1, 1, 2, 2), "SAME"),
    "max_3x3_s1_same": _pool_grad(lax.max, -jnp.inf, (1, 1, 3, 3), (1, 1, 1, 1), "SAME"),
    "min_2x3_s2_1": _pool_grad(lax.min, jnp.inf, (1, 1, 2, 3), (1, 1, 2, 1), "VALID"),
    "max_nhwc_explicit_pad": _pool_grad(lax.max, -jnp.inf, (1, 3, 3, 1), (1, 2, 2, 1),
                                        ((0, 0), (1, 1), (0, 2), (0, 0))),
}
DATA = {"random": X, "ties": TIES}


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("name", list(POOL_GRADS))
def test_the_jaxpr_expansion_computes_the_pooling_gradient(name, data):
    fn, args = POOL_GRADS[name], (DATA[data],)
    assert "select_and_scatter_add" in str(jax.make_jaxpr(fn)(*args))
    g = _from_jaxpr(fn, args)
    assert not any("scatter" in op.kind for op in g.ops)
    _assert_like_jax(g, fn, args)


@pytest.mark.parametrize("name", list(POOL_GRADS))
def test_the_hlo_expansion_computes_the_pooling_gradient(name):
    """As JAX writes it (XLA's CPU pipeline later expands it into a variadic
    reduce-window and a scatter at computed indices: tests/test_window_select.py)."""
    fn, args = POOL_GRADS[name], (TIES,)
    text = jax.jit(fn).lower(*args).as_text(dialect="hlo")
    assert "select-and-scatter" in text
    _assert_like_jax(_from_hlo(text), fn, args)


def _reference(x, src, select, window, strides, padding, init=0.0):
    """XLA's select-and-scatter, scanned element by element."""
    cmp = {"ge": np.greater_equal, "gt": np.greater, "le": np.less_equal, "lt": np.less}[select]
    out = np.full(x.shape, init, dtype=src.dtype)
    for p in itertools.product(*(range(n) for n in src.shape)):
        best = None
        for t in itertools.product(*(range(w) for w in window)):
            idx = tuple(pi * s + ti - lo for pi, s, ti, (lo, _) in zip(p, strides, t, padding))
            if any(i < 0 or i >= n for i, n in zip(idx, x.shape)):
                continue
            if best is None or not cmp(x[best], x[idx]):
                best = idx
        if best is not None:
            out[best] += src[p]
    return out


def _lowered(x, src, sw, init):
    g = Graph("sas")
    b = GraphBuilder(g, IdAllocator())
    g.inputs = [b.tensor(x.shape, "float32"), b.tensor(src.shape, "float32")]

    def emit(kind, ins, shape, dtype, params):
        return b.op(kind, ins, shape, dtype, params)

    def constant(value, dtype):
        v = np.asarray(value, dtype=np.dtype(dtype))
        return b.constant(v, v.shape, dtype)

    site = SelectSite(emit, constant)
    init_t = None if init == 0 else constant(np.float32(init), "float32")
    g.outputs = [lower_select_and_scatter(site, g.inputs[0], x.shape, "float32", g.inputs[1],
                                          src.shape, "float32", init_t, sw, ("t.hlo", 3))]
    return g


@pytest.mark.parametrize("select", ["ge", "gt", "le", "lt"])
@pytest.mark.parametrize("window,strides,padding", [
    ((2, 2), (2, 2), ((0, 0), (0, 0))),
    ((3, 3), (2, 1), ((1, 1), (2, 0))),
    ((3, 2), (1, 3), ((2, 2), (0, 1))),      # windows made of padding alone on the edges
])
def test_every_select_comparison_follows_the_scan(select, window, strides, padding):
    x = RNG.integers(-1, 2, size=(7, 6)).astype(np.float32)
    sizes = tuple((n + lo + hi - w) // s + 1 for n, w, s, (lo, hi) in zip(x.shape, window, strides,
                                                                          padding))
    src = RNG.standard_normal(sizes).astype(np.float32)
    sw = SelectWindow(select, window, strides, padding)
    g = _lowered(x, src, sw, 0.5)
    got = Interpreter(g, 1).run([[x], [src]])[g.outputs[0]][0]
    np.testing.assert_allclose(got, _reference(x, src, select, window, strides, padding, 0.5),
                               rtol=1e-6, atol=1e-6)


def test_a_source_that_does_not_fit_the_windows_is_an_error():
    sw = SelectWindow("ge", (2, 2), (2, 2), ((0, 0), (0, 0)))
    with pytest.raises(InputError) as e:
        _lowered(np.zeros((4, 4), np.float32), np.zeros((3, 2), np.float32), sw, 0)
    assert "t.hlo:3" in str(e.value) and "does not fit" in str(e.value)


def test_an_unknown_select_comparison_is_refused():
    sw = SelectWindow("eq", (2, 2), (2, 2), ((0, 0), (0, 0)))
    with pytest.raises(UnknownOpError) as e:
        _lowered(np.zeros((4, 4), np.float32), np.zeros((2, 2), np.float32), sw, 0)
    assert "t.hlo:3" in str(e.value)

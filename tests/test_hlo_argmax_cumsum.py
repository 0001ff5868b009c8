"""HLO variadic argmax/argmin reduces and prefix-scan reduce-windows: JAX-written
modules (jnp.argmax, jnp.cumsum, lax.cummax, ...) lowered to HLO text, before and
after XLA's optimisations, translate to the IR's argmax/argmin and cumsum/...
ops and compute, by the shared evaluator, what JAX computes (ties, both zeros,
infinities; NaN under the noted assumption); other forms are one-line errors
naming the instruction's line."""
# XLA_FLAGS (8 host devices): tests/conftest.py
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402

from dlverify.errors import InputError, UnknownOpError  # noqa: E402
from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module  # noqa: E402
from dlverify.interpret import Interpreter  # noqa: E402
from dlverify.ir import IdAllocator  # noqa: E402


def hlo_text(fn, *args, stage: str) -> str:
    low = jax.jit(fn, keep_unused=True).lower(*args)
    return low.as_text(dialect="hlo") if stage == "pre" else low.compile().as_text()


def lower(text: str):
    return hlo_to_graph(parse_hlo_module(text, "t.hlo"), IdAllocator(), "g")


def run(graph, *inputs):
    vals = Interpreter(graph, 1).run([[x] for x in inputs])
    return [vals[o][0] for o in graph.outputs]


def hostile(dtype=np.float32, nan: bool = False) -> np.ndarray:
    """[5, 8] with ties, both zeros and infinities (a NaN on request)."""
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    x[0, :5] = 1.0
    x[1, 1:5] = [-0.0, 0.0, -0.0, 0.0]
    x[1, 5:] = -1.0
    x[2, 2], x[2, 5] = np.inf, -np.inf
    x[3, :] = -np.inf
    if nan:
        x[4, 3] = np.nan
    if np.issubdtype(dtype, np.integer):
        x = np.nan_to_num(x * 4, posinf=9, neginf=-9)
    return x.astype(dtype)


def each_module(functions: dict):
    """Parametrize a test over `functions` by name, float32 and int32 inputs, and the
    module before (pre) and after (post) XLA's optimisations."""
    def mark(test):
        for name, values in (("stage", ["pre", "post"]), ("dtype", [np.float32, np.int32]),
                             ("name", sorted(functions))):
            test = pytest.mark.parametrize(name, values)(test)
        return test
    return mark


ARG_FUNCTIONS = {
    "argmax_rows": lambda x: jnp.argmax(x, axis=1),
    "argmin_cols": lambda x: jnp.argmin(x, axis=0),
    "argmax_and_max": lambda x: (jnp.argmax(x, axis=1), lax.reduce_max(x, (1,))),
    "lax_argmin_last": lambda x: lax.argmin(x, 1, jnp.int32),
}


@each_module(ARG_FUNCTIONS)
def test_jax_argmax_argmin_compute_what_xla_computes(name, dtype, stage):
    fn = ARG_FUNCTIONS[name]
    x = hostile(dtype)
    g, info = lower(hlo_text(fn, x, stage=stage))
    kinds = {op.kind for op in g.ops}
    assert kinds & {"argmax", "argmin"}, kinds
    got, want = run(g, x), jax.tree.leaves(fn(x))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        b = np.asarray(b)
        assert a.dtype == b.dtype and np.array_equal(a, b), (name, a, b)
    # JAX's reducer picks NaN, and keeps either of two NaN: noted for floats only
    assert all("two NaN" in n for n in info.assumptions)
    if dtype == np.int32:
        assert not info.assumptions


def test_argmax_with_one_nan_per_row_is_the_nan_index():
    fn = ARG_FUNCTIONS["argmax_rows"]
    x = hostile(nan=True)
    g, info = lower(hlo_text(fn, x, stage="pre"))
    assert np.array_equal(run(g, x)[0], np.asarray(fn(x)))
    assert any("two NaN" in n for n in info.assumptions)


SCAN_FUNCTIONS = {
    "cumsum_rows": lambda x: jnp.cumsum(x, axis=1),
    "cumsum_cols": lambda x: jnp.cumsum(x, axis=0),
    "cumsum_reverse": lambda x: lax.cumsum(x, axis=1, reverse=True),
    "cummax_cols": lambda x: lax.cummax(x, axis=0),
    "cummin_reverse": lambda x: lax.cummin(x, axis=1, reverse=True),
    "cumprod_rows": lambda x: lax.cumprod(x, axis=1),
}


def scan_input(dtype) -> np.ndarray:
    x = np.random.default_rng(1).standard_normal((6, 5)).astype(np.float32)
    return (np.round(x * 3) if np.issubdtype(dtype, np.integer) else x).astype(dtype)


@each_module(SCAN_FUNCTIONS)
def test_jax_scans_compute_what_xla_computes(name, dtype, stage):
    fn = SCAN_FUNCTIONS[name]
    x = scan_input(dtype)
    text = hlo_text(fn, x, stage=stage)
    g, _ = lower(text)
    if "reduce-window" in text:
        assert {op.kind for op in g.ops} & {"cumsum", "cumprod", "cummax", "cummin"}
    (got,), want = run(g, x), np.asarray(fn(x))
    assert got.dtype == want.dtype
    if dtype == np.int32:
        assert np.array_equal(got, want)
    else:   # the evaluator's sums run in another order than XLA's
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


SCAN_MODULE = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %r = f32[] add(%a, %b)
}

ENTRY %main (x: f32[4,6]) -> f32[4,6] {
  %x = f32[4,6] parameter(0)
  %z = f32[] constant(INIT)
  ROOT %w = f32[4,6] reduce-window(%x, %z), window={WINDOW}, to_apply=%add
}
"""


@pytest.mark.parametrize("window, dims, strides, padding", [
    ("size=1x3 pad=0_0x2_0", (1, 3), (1, 1), ((0, 0), (2, 0))),   # a window of 3: a sliding sum
    ("size=1x6 pad=0_0x3_2", (1, 6), (1, 1), ((0, 0), (3, 2))),   # centred, not a prefix
    ("size=2x6 pad=1_0x5_0", (2, 6), (1, 1), ((1, 0), (5, 0))),   # two dims at once
])
def test_other_reduce_windows_are_their_windows_sums(window, dims, strides, padding):
    """Windows that are no prefix scan are expanded into the sum over window offsets
    of slices of the padded operand (dlverify/window_lowering.py; tests/test_windows.py)."""
    g, _ = lower(SCAN_MODULE.replace("WINDOW", window).replace("INIT", "0"))
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    want = lax.reduce_window(x, 0.0, lax.add, dims, strides, padding)
    np.testing.assert_allclose(run(g, x)[0], np.asarray(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window, init, error, what", [
    ("size=1x6 pad=0_0x5_0 stride=1x2", "0", InputError, "does not fit"),   # 3 windows, not 6
    ("size=1x6 pad=0_0x5_0 rhs_dilate=1x2", "0", InputError, "does not fit"),
    ("size=1x6 pad=0_0x5_0", "1", UnknownOpError, "identity"),   # init 1 is not add's identity
])
def test_other_reduce_windows_are_errors_at_their_line(window, init, error, what):
    text = SCAN_MODULE.replace("WINDOW", window).replace("INIT", init)
    with pytest.raises(error) as e:
        lower(text)
    assert e.value.line == 12 and what in e.value.message and "\n" not in str(e.value)


JAX_ARGMAX = """HloModule m

%pick (a: f32[], ia: s32[], b: f32[], ib: s32[]) -> (f32[], s32[]) {
  %a = f32[] parameter(0)
  %ia = s32[] parameter(1)
  %b = f32[] parameter(2)
  %ib = s32[] parameter(3)
  %gt = pred[] compare(%a, %b), direction=GT
  %nan = pred[] compare(%a, %a), direction=NE
  %k1 = pred[] or(%gt, %nan)
  %v = f32[] select(%k1, %a, %b)
  %eq = pred[] compare(%a, %b), direction=EQ
  %lt = pred[] compare(%ia, %ib), direction=LT
  %tie = pred[] and(%eq, %lt)
  %k = pred[] or(%k1, %tie)
  %i = s32[] select(%k, %ia, %ib)
  ROOT %t = (f32[], s32[]) tuple(%v, %i)
}

ENTRY %main (x: f32[4,6]) -> (f32[4], s32[4]) {
  %x = f32[4,6] parameter(0)
  %io = s32[6] iota(), iota_dimension=0
  %iob = s32[4,6] broadcast(%io), dimensions={1}
  %z = f32[] constant(-inf)
  %zi = s32[] constant(0)
  %r = (f32[4], s32[4]) reduce(%x, %iob, %z, %zi), dimensions={1}, to_apply=%pick
  %m = f32[4] get-tuple-element(%r), index=0
  %g = s32[4] get-tuple-element(%r), index=1
  ROOT %o = (f32[4], s32[4]) tuple(%m, %g)
}
"""


def test_argmax_whose_values_are_read_also_gives_reduce_max():
    """JAX's argmax reducer (as in its lowering), both results read."""
    g, info = lower(JAX_ARGMAX)
    assert {"argmax", "reduce_max"} <= {op.kind for op in g.ops}
    x = hostile()[:4, :6]
    vals, idx = run(g, x)
    assert np.array_equal(vals, x.max(axis=1)) and np.array_equal(idx, x.argmax(axis=1))
    assert [n for n in info.assumptions if "two NaN" in n]


@pytest.mark.parametrize("old, new, what", [
    # keeps a on ties whatever the indices: order-dependent
    ("%gt = pred[] compare(%a, %b), direction=GT", "%gt = pred[] compare(%a, %b), direction=GE",
     "lower index"),
    # keeps b on ties: the last index if run in order
    ("%k = pred[] or(%k1, %tie)", "%k = pred[] or(%k1, %k1)", "lower index"),
    ("%iob = s32[4,6] broadcast(%io), dimensions={1}", "%iob = s32[4,6] iota(), iota_dimension=0",
     "iota along dim 1"),
    ("%zi = s32[] constant(0)", "%zi = s32[] constant(2)", "not (the identity, 0)"),
])
def test_other_variadic_reduces_are_unknown_ops_at_their_line(old, new, what):
    assert old in JAX_ARGMAX
    with pytest.raises(UnknownOpError) as e:
        lower(JAX_ARGMAX.replace(old, new))
    assert e.value.line == 26 and what in e.value.message and "\n" not in str(e.value)

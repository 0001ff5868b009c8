"""Max and min pooling's gradient as XLA's CPU pipeline compiles it: its
select-and-scatter expander writes a variadic reduce-window that carries each
window's selected position (iotas) and a scatter-add at those positions
(frontends/hlo/ops/window_select.py). The reduce-window lowers exactly (values and
positions as XLA computes them, ties and windows of padding alone included); the
scatter placing by its positions folds back into the select-and-scatter, so the
compiled gradient computes what JAX computes and has the uncompiled one's form; a
scatter whose index columns are mis-ordered is not folded; a reducer that is not such
a selection is refused at its line; the pooling examples verify compiled."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hlo_pairs import compiled_pair, example_module, verify_texts
from jax import lax
from test_conv import _assert_like_jax, _from_hlo
from test_select_scatter import DATA, POOL_GRADS

from dlverify.errors import UnknownOpError
from dlverify.interpret import Interpreter
from conftest import bug_line


@pytest.mark.parametrize("data", list(DATA))
@pytest.mark.parametrize("name", list(POOL_GRADS))
def test_the_compiled_pooling_gradient_folds_back_and_computes_what_jax_does(name, data):
    fn, args = POOL_GRADS[name], (DATA[data],)
    text = jax.jit(fn).lower(*args).compile().as_text()
    assert "select-and-scatter(" not in text and " scatter(" in text    # XLA expanded it
    g = _from_hlo(text)
    kinds = {op.kind for op in g.ops}
    assert "dot_general" not in kinds        # folded: no one-hot contraction of the positions
    _assert_like_jax(g, fn, args)


def _argmax_with_positions(select, sentinel=-1):
    """(values, row, column) of the element each window selects, as a variadic
    reduce-window: the reducer keeps the accumulated triple unless it is the
    sentinel or `select(acc, candidate)` fails (XLA's expander's reducer)."""
    def reducer(acc, cand):
        (a, ia, ja), (b, ib, jb) = acc, cand
        keep = (ib == sentinel) | ((ia != sentinel) & select(a, b))
        return (jnp.where(keep, a, b), jnp.where(keep, ia, ib), jnp.where(keep, ja, jb))

    def fn(x, window, strides, padding):
        rows = lax.broadcasted_iota(jnp.int32, x.shape, 0)
        cols = lax.broadcasted_iota(jnp.int32, x.shape, 1)
        return lax.reduce_window((x, rows, cols), (jnp.float32(0), jnp.int32(sentinel),
                                                   jnp.int32(sentinel)),
                                 reducer, window, strides, padding)
    return fn


@pytest.mark.parametrize("select", [jnp.greater_equal, jnp.greater, jnp.less_equal])
@pytest.mark.parametrize("window,strides,padding", [
    ((2, 2), (2, 2), ((0, 0), (0, 0))),
    ((3, 3), (2, 1), ((1, 1), (2, 0))),
    ((2, 2), (1, 3), ((3, 3), (0, 1))),     # windows made of padding alone: nothing selected
])
def test_the_variadic_reduce_window_gives_the_values_and_positions_xla_gives(
        select, window, strides, padding):
    x = np.random.default_rng(1).integers(-1, 2, size=(7, 6)).astype(np.float32)   # ties
    fn = _argmax_with_positions(select)

    def program(a):
        return fn(a, window, strides, padding)
    text = jax.jit(program).lower(x).as_text(dialect="hlo")
    assert "reduce-window(" in text
    g = _from_hlo(text)
    vals = Interpreter(g, 1).run([[x]])
    want = jax.jit(program)(x)
    assert len(g.outputs) == 3
    for t, w in zip(g.outputs, want):
        np.testing.assert_array_equal(np.asarray(vals[t][0]), np.asarray(w))


def test_a_reducer_that_is_not_a_selection_is_refused_at_its_line():
    def program(x):
        i = lax.broadcasted_iota(jnp.int32, x.shape, 0)
        return lax.reduce_window((x, i), (jnp.float32(0), jnp.int32(-1)),
                                 lambda a, b: (a[0] + b[0], jnp.maximum(a[1], b[1])),
                                 (2,), (2,), "VALID")
    text = jax.jit(program).lower(np.zeros(8, np.float32)).as_text(dialect="hlo")
    line = next(k for k, s in enumerate(text.splitlines(), 1) if "reduce-window(" in s)
    with pytest.raises(UnknownOpError) as e:
        _from_hlo(text)
    assert e.value.line == line and "windowed selection" in e.value.message


def test_a_scatter_whose_index_columns_are_swapped_is_not_folded():
    """The row and column positions exchanged in the scatter's indices put the
    gradient at other elements: the scatter keeps its own (exact) lowering."""
    fn, args = POOL_GRADS["max_2x2"], (DATA["random"],)
    text = jax.jit(fn).lower(*args).compile().as_text()
    lines = text.splitlines()
    (k,) = [k for k, s in enumerate(lines) if " concatenate(" in s and "s32[" in s]
    head, ops = lines[k].split(" concatenate(", 1)
    names, rest = ops.split(")", 1)
    parts = names.split(", ")
    parts[-1], parts[-2] = parts[-2], parts[-1]
    lines[k] = f"{head} concatenate({', '.join(parts)}){rest}"
    g = _from_hlo("\n".join(lines))
    assert "dot_general" in {op.kind for op in g.ops}
    got = Interpreter(g, 1).run([[a] for a in args])[g.outputs[0]][0]
    assert not np.allclose(got, np.asarray(jax.jit(fn)(*args)))


def test_the_pooling_examples_verify_compiled_and_their_twins_do_not(tmp_path):
    pool = example_module("pool_parallel")
    for case in (pool.pool_channel_parallel_grads(), pool.pool_data_parallel_grads()):
        res = verify_texts(tmp_path, *compiled_pair(case))
        assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    twin = pool.pool_data_parallel_bug_psum()
    res = verify_texts(tmp_path, *compiled_pair(twin))
    assert not res.verified and bug_line(twin.dist) in {fr.line for fr in res.failures[0].frames}
    # pooled after the reduction instead of before: XLA's fusions carry no line of it,
    # so the failure is found but not at the BUG line
    assert not verify_texts(tmp_path, *compiled_pair(pool.pool_channel_parallel_bug_pool_after_psum())).verified

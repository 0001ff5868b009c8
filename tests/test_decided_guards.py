"""dlverify/finite_values.py with `decided` selects, as dlverify/real_guards.py uses it:
a select_n whose predicate index ranges prove constant (jnp.take's NaN fill at indices
proved in range) is as finite as the case it takes, so the is_finite guard of a row max
over it is dropped, keeping the outputs on random data (the shared evaluator). A fill
that is taken on some positions, or everywhere, keeps the guard."""
import copy

import numpy as np
import pytest
from test_real_guards import _max_shift
from test_simplify import _graph, _run, _splat

from dlverify.passes import fold
from dlverify.real_guards import drop_real_guards

F = "float32"


def _filled(bound):
    """max-shift guard of reduce_max(select_n(iota < bound, nan, x)) over x [4, 6]: the
    fill is never taken when bound >= 6, always when bound <= 0."""
    def build(b, x):
        col = b.op("iota", [], (4, 6), "int32", {"dimension": 1})
        k = b.op("broadcast_in_dim", [b.constant(np.int32(bound), (), "int32")], (4, 6), "int32",
                 {"broadcast_dimensions": ()})
        inside = b.op("lt", [col, k], (4, 6), "bool")
        sel = b.op("select_n", [inside, _splat(b, np.nan, (4, 6)), x], (4, 6), F)
        return _max_shift(b, sel)
    return build


@pytest.mark.parametrize("bound,dropped", [(6, True), (100, True), (3, False), (0, False)])
def test_a_guard_over_a_decided_fill_goes_only_when_the_fill_is_never_taken(bound, dropped):
    g, ids = _graph(_filled(bound), [(4, 6)])
    before = copy.deepcopy(g)
    plain = copy.deepcopy(g)
    drop_real_guards(plain, ids)   # without the decided selects: the guard stays (the max(-inf) goes)
    assert "is_finite" in {op.kind for op in plain.ops}
    assert drop_real_guards(g, ids, fold(g, None).splat)
    assert ("is_finite" in {op.kind for op in g.ops}) != dropped
    rng = np.random.default_rng(0)
    for _ in range(3):
        x = rng.standard_normal((4, 6)).astype(np.float32)
        np.testing.assert_array_equal(_run(before, [x])[0], _run(g, [x])[0])

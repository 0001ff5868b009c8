"""(a - c) == iota as a == iota + c (dlverify/offset_compare.py): the rewrite keeps
the values on random and extreme integers (wrapping) with the shared evaluator and
fires through broadcasts, reshapes and transposes on either side of the compare; it
leaves order comparisons, floats and comparisons with a value that is not an index;
examples/onehot_embedding.py's one-hot embedding verifies and its twins are located."""
import copy

import numpy as np
import pytest
from conftest import EXAMPLES, bug_line

from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.offset_compare import move_compare_offsets

I32 = "int32"


def _build(kind="eq", dtype=I32, index=True, chain=("broadcast",), swap=False):
    """cmp(m(a - c), iota-like) over a [6] and c [6] -> [6, 4]."""
    ids = IdAllocator()
    g = Graph("g")
    b = GraphBuilder(g, ids)
    a, c = b.tensor((6,), dtype, "a"), b.tensor((6,), dtype, "c")
    g.inputs = [a, c]
    d = b.op("sub", [a, c], (6,), dtype)
    if "reshape" in chain:
        d = b.op("reshape", [d], (6, 1), dtype)
        d = b.op("broadcast_in_dim", [d], (6, 4), dtype, {"broadcast_dimensions": (0, 1)})
    else:
        d = b.op("broadcast_in_dim", [d], (6, 4), dtype, {"broadcast_dimensions": (0,)})
    if "transpose" in chain:
        d = b.op("transpose", [d], (4, 6), dtype, {"permutation": (1, 0)})
    shape = b.graph.tensors[d].shape
    if index:
        axis = shape.index(4)
        other = b.op("iota", [], shape, dtype, {"dimension": axis})
    else:
        other = b.tensor(shape, dtype, "x")
        g.inputs.append(other)
    ins = [other, d] if swap else [d, other]
    g.outputs = [b.op(kind, ins, shape, "bool")]
    return g, ids


def _values(g, rng, dtype):
    info = np.iinfo(np.dtype(dtype)) if dtype.startswith("int") else None
    out = []
    for t in g.inputs:
        shape = g.tensors[t].shape
        if info is None:
            out.append(rng.standard_normal(shape).astype(dtype))
        else:   # small values (many matches) and the extremes (wrapping)
            v = rng.integers(-3, 5, size=shape)
            v.flat[0], v.flat[-1] = info.min, info.max
            out.append(v.astype(dtype))
    return out


def _same_values(before, after, dtype="int32"):
    rng = np.random.default_rng(0)
    for _ in range(5):
        ins = _values(before, rng, dtype)
        want = Interpreter(before, 1).run([[x] for x in ins])[before.outputs[0]][0]
        got = Interpreter(after, 1).run([[x] for x in ins])[after.outputs[0]][0]
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("kind", ["eq", "ne"])
@pytest.mark.parametrize("chain", [("broadcast",), ("reshape",), ("broadcast", "transpose")])
@pytest.mark.parametrize("swap", [False, True])
def test_the_offset_moves_to_the_iota(kind, chain, swap):
    g, ids = _build(kind, chain=chain, swap=swap)
    before = copy.deepcopy(g)
    assert move_compare_offsets(g, ids)
    producer = {op.output: op for op in g.ops}
    cmp = producer[g.outputs[0]]
    data, index = (cmp.inputs[1], cmp.inputs[0]) if swap else cmp.inputs
    assert producer[index].kind == "add" and "sub" not in {op.kind for op in g.ops}
    assert producer[data].kind in ("broadcast_in_dim", "transpose")
    _same_values(before, g)


@pytest.mark.parametrize("case", [dict(kind="lt"), dict(kind="ge"), dict(dtype="float32"),
                                  dict(index=False)])
def test_order_comparisons_floats_and_non_indices_are_left(case):
    g, ids = _build(**case)
    before = copy.deepcopy(g)
    assert not move_compare_offsets(g, ids)
    _same_values(before, g, case.get("dtype", "int32"))


def test_the_one_hot_embedding_example_verifies_and_its_twins_are_located(example_runs):
    path = EXAMPLES / "onehot_embedding.py"
    for name in ("onehot_embedding_tp", "onehot_embedding_tp_grads"):
        assert example_runs.run(path, name).result.verified
    for name in ("onehot_embedding_bug_next_offset", "onehot_embedding_bug_grad_averaged"):
        run = example_runs.run(path, name)
        assert not run.result.verified
        assert bug_line(run.case.dist) in {f.line for f in run.result.failures[0].frames}

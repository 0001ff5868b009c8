"""dlverify/const_layout.py: layout ops of array constants become constants, so a
literal XLA stored in its readers' layout relates by value to the sequential
program's own literal and reshape.

The fold keeps every value (the graph runs the same before and after); splats and
non-layout ops are left alone; a closed-over array used before a shard_map, its
program compiled by XLA and dumped with large constants, verifies, and the twin
with a wrong constant does not, located at its `# BUG` line."""
import copy

import numpy as np
from hlo_pairs import assert_compiled_case_and_twin, example_module

from dlverify.const_layout import fold_constant_layouts
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator


def test_layouts_of_array_constants_fold_and_keep_their_values():
    g = Graph("g")
    b = GraphBuilder(g, IdAllocator())
    x = b.tensor((4, 2), "float32", "x")
    g.inputs.append(x)
    table = b.constant(np.arange(8, dtype=np.float32).reshape(1, 8), (1, 8), "float32")
    flat = b.op("reshape", [table], (4, 2), "float32")
    moved = b.op("transpose", [flat], (2, 4), "float32", {"permutation": (1, 0)})
    ones = b.constant(np.ones((1, 8), np.float32), (1, 8), "float32")
    ones_flat = b.op("reshape", [ones], (4, 2), "float32")
    scaled = b.op("mul", [x, flat], (4, 2), "float32")
    g.outputs = [moved, scaled, ones_flat]
    before = copy.deepcopy(g)
    assert fold_constant_layouts(g)
    kinds = {op.output: op.kind for op in g.ops}
    assert kinds[flat] == kinds[moved] == "constant"
    assert kinds[ones_flat] == "reshape" and kinds[scaled] == "mul"   # a splat; not a layout op
    xs = [np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)]
    want, got = Interpreter(before, 1).run([xs]), Interpreter(g, 1).run([xs])
    for t in g.outputs:
        np.testing.assert_array_equal(want[t][0], got[t][0])
    assert not fold_constant_layouts(g)


def test_closed_over_array_before_a_shard_map_verifies_from_its_dump(tmp_path):
    outside = example_module("outside_shard_map")
    assert_compiled_case_and_twin(tmp_path, outside.outside_pre_and_post(),
                                  outside.outside_bug_wrong_constant(), dumped=True)

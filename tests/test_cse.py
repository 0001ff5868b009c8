"""dlverify/cse.py: values computed twice are computed once, before the rewrites
that read a program's structure (XLA's compiled modules recompute cheap values
in every fusion that reads them).

The merge keeps every value (checked by running the graph before and after);
collectives and custom calls are never merged; ring attention compiled by XLA
verifies from its HLO (its running maxima are maxima of the very blocks they
shift only once the recomputed divisions are merged), and its buggy twin does
not, located at its `# BUG` line."""
import copy

import numpy as np
from hlo_pairs import assert_compiled_case_and_twin, example_module

from dlverify.cse import merge_common_values
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator


def _duplicated_fusions() -> tuple[Graph, dict[str, int]]:
    """x / 2 computed in two 'fusions', each broadcasting 2 anew; a psum of each; a
    custom call read twice."""
    g = Graph("g")
    b = GraphBuilder(g, IdAllocator())
    x = b.tensor((4, 4), "float32", "x")
    g.inputs.append(x)
    two = b.constant(np.float32(2.0), (), "float32")
    n = {}
    for i in range(2):
        splat = b.op("broadcast_in_dim", [two], (4, 4), "float32", {"broadcast_dimensions": ()})
        n[f"div{i}"] = b.op("div", [x, splat], (4, 4), "float32")
        n[f"psum{i}"] = b.op("all_reduce", [n[f"div{i}"]], (4, 4), "float32",
                            {"reducer": "sum", "groups": [[0, 1]]})
    n["sum"] = b.op("add", [n["div1"], n["div0"]], (4, 4), "float32")
    n["sum_swapped"] = b.op("add", [n["div0"], n["div1"]], (4, 4), "float32")
    g.outputs = [n["psum0"], n["psum1"], n["sum"], n["sum_swapped"]]
    return g, n


def test_duplicates_merge_and_every_value_is_kept():
    g, n = _duplicated_fusions()
    before = copy.deepcopy(g)
    alias = merge_common_values(g)
    assert alias[n["div1"]] == n["div0"] and alias[n["sum_swapped"]] == n["sum"]
    kinds = [op.kind for op in g.ops]
    assert kinds.count("div") == 1 and kinds.count("broadcast_in_dim") == 1
    assert kinds.count("all_reduce") == 2          # collectives are never merged
    assert len(g.folded) == len(alias)             # merged ops stay for diagnosis
    x = [np.random.default_rng(r).standard_normal((4, 4)).astype(np.float32) for r in range(2)]
    want = Interpreter(before, 2).run([x])
    got = Interpreter(g, 2).run([x])
    for t_before, t_after in zip(before.outputs, g.outputs):
        for r in range(2):
            np.testing.assert_array_equal(want[t_before][r], got[t_after][r])


def test_nothing_to_merge_changes_nothing():
    g, _ = _duplicated_fusions()
    merge_common_values(g)
    ops = list(g.ops)
    assert merge_common_values(g) == {} and g.ops == ops


def test_compiled_ring_attention_verifies_and_its_twin_is_located(tmp_path):
    ring = example_module("ring_attention")
    assert_compiled_case_and_twin(tmp_path, ring.ring_attention_forward(), ring.ring_bug_rescale_inverted())

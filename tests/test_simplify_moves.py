"""dlverify/simplify_moves.py: layout ops leave collective permutes, a dot reads the
tensor whose size-1 dims an operand only moves, and a commutative op reads a
literal last. Every rewrite leaves the outputs unchanged (the shared evaluator, on
several ranks for the permutes) and fires only where it may; the normal form
reaches a fixpoint. Then the examples these rules serve, compiled by XLA, verify
from their HLO: the GPipe schedule (a stage's size-1 micro-batch dim deleted
before its permute and its dots) and the scanned TP stack's training step (GELU's
`0.044715 * x**3` written `x**3 * 0.044715` by one program); their twins do not,
located at their `# BUG` line."""
import copy

import pytest
from hlo_pairs import assert_compiled_case_and_twin, example_module
from test_simplify import _dot, _graph, _ranks_agree, _splat

from dlverify.simplify import simplify_graph

RING = [(0, 1), (1, 2), (2, 3), (3, 0)]


def _simplified(build, in_shapes, ranks=2):
    """`build`'s graph in normal form (which changes it, and is a fixpoint), checked to
    compute the same on `ranks` ranks."""
    g, ids = _graph(build, in_shapes)
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    _ranks_agree(before, g, in_shapes, ranks)
    assert not simplify_graph(g, ids)           # no rule undoes another
    return g


# ------------------------------------------------------------------ permutes

@pytest.mark.parametrize("layout, to, params", [
    ("reshape", (8,), {}),                                   # a stage's [1, 8] as [8]
    ("reshape", (2, 1, 4), {}),
    ("transpose", (4, 2), {"permutation": (1, 0)}),
])
@pytest.mark.parametrize("pairs", [RING, [(0, 1), (2, 3)]])  # ranks 0 and 2 receive zeros
def test_a_permute_of_a_layout_op_is_the_layout_op_of_the_permute(layout, to, params, pairs):
    def build(b, x):
        y = b.op(layout, [b.op("tanh", [x], (2, 4), "float32")], to, "float32", params)
        return b.op("collective_permute", [y], to, "float32", {"pairs": pairs})
    g = _simplified(build, [(2, 4)], ranks=4)
    assert [op.kind for op in g.ops] == ["tanh", "collective_permute", layout]


def test_a_permute_of_another_op_stays():
    def build(b, x):
        y = b.op("tanh", [x], (2, 4), "float32")
        return b.op("collective_permute", [y], (2, 4), "float32", {"pairs": RING})
    g, ids = _graph(build, [(2, 4)])
    assert not simplify_graph(g, ids)


# ------------------------------------------------------------------ size-1 dims in dots

@pytest.mark.parametrize("y_shape, lhs, perm, lhs_batch", [
    ((2, 1, 8), (1, 2, 8), None, ()),            # a size-1 dim moved
    ((2, 8), (2, 1, 8), None, ()),               # a size-1 dim inserted
    ((1, 2, 8), (2, 1, 1, 8), None, ()),         # moved and one more inserted
    ((2, 1, 8), (1, 2, 8), None, (0,)),          # the moved dim is a batch dim
    ((2, 1, 8), (2, 1, 1, 8), (1, 0, 2, 3), ()),  # through a transpose of size-1 dims only
    ((8, 2), (8, 1, 2), (2, 1, 0), ()),           # ... or of sized dims: y read transposed
    ((8, 1, 2), (8, 1, 1, 2), (1, 3, 2, 0), (0,)),  # ... a size-1 batch dim among them
])
def test_a_dot_reads_the_tensor_whose_size_1_dims_its_operand_moves(y_shape, lhs, perm,
                                                                     lhs_batch):
    shape = lhs if perm is None else tuple(lhs[d] for d in perm)
    k = shape[-1]
    w_shape = (1, k, 4) if lhs_batch else (k, 4)
    free = tuple(n for d, n in enumerate(shape[:-1]) if d not in lhs_batch)
    out = (1,) * len(lhs_batch) + free + (4,)

    def build(b, y, w):
        x = b.op("reshape", [y], lhs, "float32")
        if perm is not None:
            x = b.op("transpose", [x], shape, "float32", {"permutation": perm})
        return _dot(b, x, w, out, (len(shape) - 1,), (len(w_shape) - 2,), lhs_batch,
                    (0,) if lhs_batch else ())
    g = _simplified(build, [y_shape, w_shape])
    (dot,) = [op for op in g.ops if op.kind == "dot_general"]
    lhs = {op.output: op for op in g.ops}.get(dot.inputs[0])
    # y itself, or y in the dot's standard order (a batch dim first: dot_layout's)
    assert dot.inputs[0] == g.inputs[0] or (lhs.kind == "transpose"
                                            and lhs.inputs[0] == g.inputs[0])


@pytest.mark.parametrize("case", ["too_few_size_1_dims", "regroups_sized_dims"])
def test_dot_operands_that_move_more_than_size_1_dims_stay(case):
    def build(b, y, w):
        if case == "too_few_size_1_dims":           # a batch dim y has no size-1 dim for
            x = b.op("reshape", [y], (1, 2, 8), "float32")
            return _dot(b, x, w, (1, 2, 4), (2,), (1,), (0,), (0,))
        x = b.op("reshape", [y], (4, 4), "float32")  # [2, 8] regrouped: sink_dot_reshape's
        return _dot(b, x, w, (4, 4), (1,), (0,))
    w_shape = {"too_few_size_1_dims": (1, 8, 4), "regroups_sized_dims": (4, 4)}[case]
    g, ids = _graph(build, [(2, 8), w_shape])
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    _ranks_agree(before, g, [(2, 8), w_shape])
    assert all(op.inputs[0] != g.inputs[0] for op in g.ops if op.kind == "dot_general")


def test_a_pipeline_of_permuted_stages_reaches_the_batched_dots_of_its_program():
    # the compiled GPipe stage: tanh(x @ w) with x's size-1 micro-batch dim deleted, sent
    # on by a permute, and the next stage's dot of it and of w with its size-1 stage dim
    # deleted; the program keeps both size-1 dims and batches over them
    def build(b, x, w):
        w2 = b.op("reshape", [w], (8, 8), "float32")
        h = x
        for _ in range(3):
            y = b.op("tanh", [_dot(b, b.op("reshape", [h], (2, 8), "float32"), w2, (2, 8),
                                   (1,), (0,))], (2, 8), "float32")
            y = b.op("collective_permute", [y], (2, 8), "float32", {"pairs": RING})
            h = b.op("reshape", [y], (1, 2, 8), "float32")
        return h
    g = _simplified(build, [(1, 2, 8), (1, 8, 8)], ranks=4)
    dots = [op for op in g.ops if op.kind == "dot_general"]
    assert len(dots) == 3 and all(op.params["lhs_batch"] == (0,) for op in dots)
    assert all(g.tensors[op.output].shape == (1, 2, 8) for op in dots)
    assert [op.kind for op in g.ops].count("reshape") == 0


# ------------------------------------------------------------------ literals last

@pytest.mark.parametrize("kind", ["mul", "add", "max", "min"])
def test_a_commutative_op_reads_its_literal_last(kind):
    def build(b, x):
        return b.op(kind, [_splat(b, 0.044715, (3, 4)), x], (3, 4), "float32")
    g = _simplified(build, [(3, 4)])
    (op,) = [op for op in g.ops if op.kind == kind]
    assert op.inputs[0] == g.inputs[0]


@pytest.mark.parametrize("case", ["sub", "literal_last"])
def test_other_operand_orders_stay(case):
    def build(b, x):
        c = _splat(b, 0.044715, (3, 4))
        if case == "sub":               # not commutative
            return b.op("sub", [c, x], (3, 4), "float32")
        return b.op("mul", [x, c], (3, 4), "float32")
    g, ids = _graph(build, [(3, 4)])
    assert not simplify_graph(g, ids)


# ------------------------------------------------------------------ compiled examples

@pytest.mark.parametrize("twin", ["gpipe_bug_missing_psum", "gpipe_bug_pmean"])
def test_compiled_gpipe_schedule_verifies_and_its_twins_are_located(tmp_path, twin):
    gpipe = example_module("pipeline_gpipe")
    assert_compiled_case_and_twin(tmp_path, gpipe.gpipe_forward(), getattr(gpipe, twin)(),
                                  dumped=True)


def test_compiled_scanned_stack_training_verifies_and_its_twin_is_located(tmp_path):
    scan = example_module("scan_layers")
    assert_compiled_case_and_twin(tmp_path, scan.scan_stack_training(),
                                  scan.scan_stack_bug_missing_psum(), dumped=True)

"""The normal form's rules for a transpose of a dot's result (dlverify/simplify_layouts.py):
each rewrite leaves the outputs unchanged on random data (evaluated by the shared
evaluator, on several ranks where collectives are involved) and fires; the two ways
of writing a value (the dot transposed, or the swapped dot; the transpose before or
after a gather, a slice, a concatenation) reach one form; and the compiled
all-gather-KV context-parallel gradients of examples/ verify while a buggy twin is
located; so do the compiled Ulysses gradients (their derived views checked on random
inputs), while the Ulysses twins do not."""
import copy
import itertools

import numpy as np
import pytest
from hlo_pairs import assert_compiled_case_and_twin, compiled_pair, example_module, verify_texts
from rulekit import assert_views_hold
from test_simplify import _check, _dot, _graph

from dlverify.interpret import Interpreter
from dlverify.ir import Graph
from dlverify.simplify import simplify_graph


def _expr(g: Graph, t: int, producer: dict) -> str:
    """The value of tensor t as an expression of the graph's inputs (op order aside)."""
    op = producer.get(t)
    if op is None:
        return f"in{g.inputs.index(t)}" if t in g.inputs else f"?{g.tensors[t].shape}"
    params = sorted((k, str(v)) for k, v in op.params.items())
    args = ", ".join(_expr(g, i, producer) for i in op.inputs)
    return f"{op.kind}{params}{g.tensors[t].shape}({args})"


def _form(g: Graph) -> list[str]:
    producer = {op.output: op for op in g.ops}
    return [_expr(g, t, producer) for t in g.outputs]


def _normal(build, in_shapes) -> tuple[Graph, Graph]:
    g, ids = _graph(build, in_shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    return before, g


def _agree(before: Graph, g: Graph, in_shapes, ranks: int = 1) -> None:
    """Both graphs' outputs on `ranks` ranks, each rank its own random inputs (a rank's
    axis index is its number)."""
    rng = np.random.default_rng(7)
    ins = [[rng.standard_normal(s).astype(np.float32) for _ in range(ranks)] for s in in_shapes]
    for t0, t1 in zip(before.outputs, g.outputs):
        a = Interpreter(before, ranks, lambda r, axis: r).run(ins)[t0]
        b = Interpreter(g, ranks, lambda r, axis: r).run(ins)[t1]
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ transposed dots
# a batched dot [h, s, d] x [h, d, t] -> [h, s, t], lhs free dims (s, u) where asked
_BATCHED = dict(lhs=(3, 4, 2), rhs=(3, 2, 5), out=(3, 4, 5), lc=(2,), rc=(1,), lb=(0,), rb=(0,))
_TWO_FREE = dict(lhs=(3, 4, 6, 2), rhs=(3, 2, 5), out=(3, 4, 6, 5), lc=(3,), rc=(1,), lb=(0,),
                 rb=(0,))
_TWO_BATCH = dict(lhs=(2, 3, 4, 2), rhs=(2, 3, 2, 5), out=(2, 3, 4, 5), lc=(3,), rc=(2,),
                  lb=(0, 1), rb=(0, 1))


def _transposed_dot(spec, perm):
    def build(b, x, y):
        d = _dot(b, x, y, spec["out"], spec["lc"], spec["rc"], spec["lb"], spec["rb"])
        return b.op("transpose", [d], tuple(spec["out"][j] for j in perm), "float32",
                    {"permutation": perm})
    return build


def _regions(spec, perm) -> list[int]:
    """Each dim of the transposed result: 0 a batch dim, 1 an lhs free dim, 2 an rhs one."""
    nb = len(spec["lb"])
    nl = len(spec["lhs"]) - nb - len(spec["lc"])
    return [0 if j < nb else 1 if j < nb + nl else 2 for j in perm]


def _absorbable(spec, perm) -> bool:
    """Whether perm lists the dot's batch dims first, then one operand's free dims,
    then the other's (a dot computes that order)."""
    region = _regions(spec, perm)
    return region in (sorted(region), sorted(region, key=lambda r: (r > 0, -r)))


def _splittable(spec, perm) -> bool:
    """Whether no dot computes perm's order, but the dot with the operand perm reads
    first as lhs, the batch and free dims in perm's order, differs from the dot (no
    size-1 dims in these specs: free dims interleaved are split too, see
    tests/test_dot_orientation.py)."""
    free = [r for r in _regions(spec, perm) if r]
    in_dot = [j for r in (0, free[0], 3 - free[0]) for j in perm if _regions(spec, [j]) == [r]]
    return not _absorbable(spec, perm) and in_dot != list(range(len(perm)))


@pytest.mark.parametrize("spec, perm, taken", [
    (_BATCHED, (0, 2, 1), "whole"),           # the swapped dot: no transpose left
    (_BATCHED, (2, 0, 1), "split"),           # the swapped dot, its batch dim moved after
    (_BATCHED, (1, 2, 0), "stays"),           # the dot computes [s, t]: only h moves
    (_TWO_FREE, (0, 2, 1, 3), "whole"),       # lhs free dims reordered in the lhs
    (_TWO_FREE, (0, 3, 2, 1), "whole"),       # swapped, the lhs free dims reordered
    (_TWO_FREE, (2, 1, 0, 3), "split"),       # lhs free dims reordered, the batch dim moved
    (_TWO_FREE, (0, 2, 3, 1), "split"),       # the two operands' free dims interleaved
    (_TWO_FREE, (2, 3, 0, 1), "split"),       # interleaved, the batch dim moved
    (_TWO_BATCH, (1, 0, 2, 3), "whole"),      # batch dims reordered in both operands
    (_TWO_BATCH, (1, 0, 3, 2), "whole"),
    (_TWO_BATCH, (1, 3, 0, 2), "split"),      # batch dims reordered, swapped, one moved
])
def test_a_transpose_a_dot_computes_whole_or_up_to_its_batch_dims_is_taken_into_the_dot(
        spec, perm, taken):
    # the program's weight gradient transpose(dy^T x) is XLA's x^T dy; Ulysses' dq^T
    # transposed to [q, h, d] is dq = ds k transposed to it
    assert (_absorbable(spec, perm), _splittable(spec, perm)) == (taken == "whole",
                                                                  taken == "split")
    before, g = _normal(_transposed_dot(spec, perm), [spec["lhs"], spec["rhs"]])
    if taken == "stays":
        assert _form(before) == _form(g)
        return
    _agree(before, g, [spec["lhs"], spec["rhs"]])
    out = next(op for op in g.ops if op.output == g.outputs[0])
    if taken == "whole":
        assert out.kind == "dot_general"
        return
    # what is left moves batch dims only, unless perm interleaves the operands' free
    # dims: the free dims of one operand in the dot's order
    assert out.kind == "transpose"
    regions = _regions(spec, perm)
    for side in (1, 2):
        assert [j for j, r in zip(out.params["permutation"], regions) if r == side] == sorted(
            j for j, r in zip(out.params["permutation"], regions) if r == side)
    assert next(op for op in g.ops if op.output == out.inputs[0]).kind == "dot_general"


@pytest.mark.parametrize("spec", [_BATCHED, _TWO_FREE, _TWO_BATCH])
def test_a_transposed_dot_and_its_swapped_dot_reach_one_form(spec):
    # whichever operand order a side writes, a value a dot computes reaches one form:
    # every perm, dot(x, y) transposed by perm against dot(y, x) transposed by the perm
    # that gives the same value (also where a transpose is left: moving batch dims, or
    # interleaving the operands' free dims)
    nb = len(spec["lb"])
    nl = len(spec["out"]) - nb - (len(spec["rhs"]) - nb - len(spec["rc"]))
    rank = len(spec["out"])
    # dot(y, x)'s dims as dot(x, y)'s: batch, then y's free dims (x's after)
    swapped = list(range(nb)) + list(range(nb + nl, rank)) + list(range(nb, nb + nl))
    for perm in itertools.permutations(range(rank)):
        def build(b, x, y, perm=perm):
            d = _dot(b, y, x, tuple(spec["out"][j] for j in swapped), spec["rc"], spec["lc"],
                     spec["rb"], spec["lb"])
            q = tuple(swapped.index(j) for j in perm)
            return b.op("transpose", [d], tuple(spec["out"][j] for j in perm), "float32",
                        {"permutation": q})
        before_one, one = _normal(_transposed_dot(spec, perm), [spec["lhs"], spec["rhs"]])
        before, other = _normal(build, [spec["lhs"], spec["rhs"]])
        assert _form(one) == _form(other), perm
        _agree(before, other, [spec["lhs"], spec["rhs"]])
        _agree(before_one, one, [spec["lhs"], spec["rhs"]])


@pytest.mark.parametrize("reader", ["transpose", "dot"])
def test_a_transpose_its_reader_composes_is_split_as_the_composition(reader):
    # the program's einsum output transposed (its batch dim moved), then read by a
    # transpose, or by a dot contracting that batch dim (whose operand layout composes
    # it): the composition (interleaving the free dims) is split as a whole, or left
    # (the dot's reader), as the other side's single transpose is, instead of the dot
    # taking the first one's order
    spec, first = _TWO_FREE, (2, 1, 0, 3)          # [6, 4, 3, 5]: the batch dim moved
    shapes = [spec["lhs"], spec["rhs"], (3, 6)]
    mid = tuple(spec["out"][j] for j in first)
    composed = (2, 3, 0, 1) if reader == "transpose" else (1, 3, 0, 2)
    assert _splittable(spec, first)
    assert _splittable(spec, composed) == (reader == "transpose")

    def build(b, x, y, w):
        t = _transposed_dot(spec, first)(b, x, y)
        if reader == "transpose":
            return b.op("transpose", [t], tuple(mid[j] for j in (0, 3, 2, 1)), "float32",
                        {"permutation": (0, 3, 2, 1)})
        return _dot(b, t, w, (4, 5), (2, 0), (0, 1))     # contracts [3, 6]

    def build_composed(b, x, y, w):
        t = _transposed_dot(spec, composed)(b, x, y)
        return t if reader == "transpose" else _dot(b, t, w, (4, 5), (2, 3), (0, 1))
    before, g = _normal(build, shapes)
    _agree(before, g, shapes)
    _, other = _normal(build_composed, shapes)
    assert _form(g) == _form(other)


@pytest.mark.parametrize("other", [None, "transpose", "dot"])
def test_a_transpose_read_as_it_is_is_split_whatever_its_other_readers(other):
    # JAX's attention output v^T p^T ([b, h, e, q]) transposed to [b, q, e, h] and read
    # by the output projection contracting (e, h) in dot_layout's order: split to XLA's
    # p v ([b, h, q, e]) and a transpose of h, also when a second reader composes the
    # layout (a transpose, a dot contracting h in another order), which one side's
    # compiler may have merged away: the projection reads one form on both sides
    shapes = [(2, 3, 5, 6), (2, 3, 4, 6), (5, 3, 7), (3, 5, 7)]   # vt, p, wo, wo2

    def projection(b, t, wo):
        return _dot(b, t, wo, (2, 4, 7), (2, 3), (0, 1))

    def build(b, vt, p, wo, wo2, xla=False):
        if xla:     # p v, transposed to [b, q, e, h]
            d = _dot(b, p, vt, (2, 3, 4, 5), (3,), (3,), (0, 1), (0, 1))
            t = b.op("transpose", [d], (2, 4, 5, 3), "float32", {"permutation": (0, 2, 3, 1)})
        else:
            d = _dot(b, vt, p, (2, 3, 5, 4), (3,), (3,), (0, 1), (0, 1))
            t = b.op("transpose", [d], (2, 4, 5, 3), "float32", {"permutation": (0, 3, 2, 1)})
        out = projection(b, t, wo)
        if xla or other is None:
            return out
        if other == "transpose":     # [b, q, h, e], projected
            u = b.op("transpose", [t], (2, 4, 3, 5), "float32", {"permutation": (0, 1, 3, 2)})
            second = _dot(b, u, wo2, (2, 4, 7), (2, 3), (0, 1))
        else:                        # contracting (h, e) of t as it stands
            second = _dot(b, t, wo2, (2, 4, 7), (3, 2), (0, 1))
        return b.op("add", [out, second], (2, 4, 7), "float32", {})

    before, g = _normal(build, shapes)
    _agree(before, g, shapes)
    _, xla = _normal(lambda *a: build(*a, xla=True), shapes)
    (want,) = _form(xla)
    assert "(2, 3, 4, 5)" in want            # (p v: the dot XLA writes)
    assert want in _form(g)[0]


def _gathered_dot(transpose_first: bool, perm=(1, 0)):
    # k = x @ w on each rank's rows, gathered over 2 ranks and transposed (k^T for q k^T)
    def build(b, x, w):
        d = _dot(b, x, w, (3, 4), (1,), (0,))
        if transpose_first:
            t = b.op("transpose", [d], (4, 3), "float32", {"permutation": perm})
            return b.op("all_gather", [t], (4, 6), "float32", {"dimension": 1, "groups": [[0, 1]]})
        gathered = b.op("all_gather", [d], (6, 4), "float32", {"dimension": 0, "groups": [[0, 1]]})
        return b.op("transpose", [gathered], (4, 6), "float32", {"permutation": perm})
    return build


def test_a_transposed_gather_of_a_dot_is_the_gather_of_the_swapped_dot():
    # XLA gathers k = x @ w and transposes it; the program's k^T is w^T x^T
    before, g = _normal(_gathered_dot(False), [(3, 5), (5, 4)])
    assert [op.kind for op in g.ops if op.kind != "transpose"] == ["dot_general", "all_gather"]
    gather = g.ops[-1]
    assert gather.output == g.outputs[0] and gather.params["dimension"] == 1
    _agree(before, g, [(3, 5), (5, 4)], ranks=2)
    _, other = _normal(_gathered_dot(True), [(3, 5), (5, 4)])
    assert _form(g) == _form(other)


def test_a_transpose_through_two_gathers_is_the_gathers_of_the_swapped_dot():
    # a batched dot [h, s, t] gathered along s over [[0, 1], [2, 3]], then along h over
    # [[0, 2], [1, 3]], then transposed to [h, t, s]: the dot takes the swap, its
    # gathers' dims moved alike
    def build(b, x, y):
        d = _dot(b, x, y, (2, 3, 4), (2,), (1,), (0,), (0,))
        g1 = b.op("all_gather", [d], (2, 6, 4), "float32",
                  {"dimension": 1, "groups": [[0, 1], [2, 3]]})
        g2 = b.op("all_gather", [g1], (4, 6, 4), "float32",
                  {"dimension": 0, "groups": [[0, 2], [1, 3]]})
        return b.op("transpose", [g2], (4, 4, 6), "float32", {"permutation": (0, 2, 1)})
    shapes = [(2, 3, 5), (2, 5, 4)]
    before, g = _normal(build, shapes)
    assert not [op for op in g.ops if op.kind == "transpose" and op.output in g.outputs]
    assert [op.params["dimension"] for op in g.ops if op.kind == "all_gather"] == [2, 0]
    _agree(before, g, shapes, ranks=4)

    def build_swapped(b, x, y):       # the same value, the dot transposed before gathering
        d = _dot(b, x, y, (2, 3, 4), (2,), (1,), (0,), (0,))
        t = b.op("transpose", [d], (2, 4, 3), "float32", {"permutation": (0, 2, 1)})
        g1 = b.op("all_gather", [t], (2, 4, 6), "float32",
                  {"dimension": 2, "groups": [[0, 1], [2, 3]]})
        return b.op("all_gather", [g1], (4, 4, 6), "float32",
                    {"dimension": 0, "groups": [[0, 2], [1, 3]]})
    before2, other = _normal(build_swapped, shapes)
    _agree(before2, other, shapes, ranks=4)
    assert _form(g) == _form(other)


def test_a_transposed_gather_of_a_dot_moving_its_batch_dim_stays():
    def build(b, x, y):
        d = _dot(b, x, y, (2, 3, 4), (2,), (1,), (0,), (0,))
        g1 = b.op("all_gather", [d], (2, 6, 4), "float32", {"dimension": 1, "groups": [[0, 1]]})
        return b.op("transpose", [g1], (6, 2, 4), "float32", {"permutation": (1, 0, 2)})
    g, ids = _graph(build, [(2, 3, 5), (2, 5, 4)])
    assert not simplify_graph(g, ids)


def test_a_transposed_gather_of_no_dot_stays():
    def build(b, x):
        gathered = b.op("all_gather", [x], (6, 4), "float32", {"dimension": 0, "groups": [[0, 1]]})
        return b.op("transpose", [gathered], (4, 6), "float32", {"permutation": (1, 0)})
    g, ids = _graph(build, [(3, 4)])
    assert not simplify_graph(g, ids)


# --------------------------------------------------- concatenations and slices
def test_a_transposed_concatenation_is_the_concatenation_of_the_transposes():
    def build(b, x, y):
        cat = b.op("concatenate", [x, y], (5, 3, 2), "float32", {"dimension": 0})
        return b.op("transpose", [cat], (3, 2, 5), "float32", {"permutation": (1, 2, 0)})
    g = _check(build, [(2, 3, 2), (3, 3, 2)], set())
    (cat,) = [op for op in g.ops if op.kind == "concatenate"]
    assert cat.output == g.outputs[0] and cat.params["dimension"] == 2


def test_the_weight_gradients_of_a_concatenation_transposed_meet_the_swapped_dots():
    # the program's fused QKV gradient: transpose(concat(dy_i^T x)); XLA's concat(x^T dy_i)
    def build(b, x, d1, d2):
        parts = [_dot(b, d, x, (4, 5), (0,), (0,)) for d in (d1, d2)]
        cat = b.op("concatenate", parts, (8, 5), "float32", {"dimension": 0})
        return b.op("transpose", [cat], (5, 8), "float32", {"permutation": (1, 0)})

    def build_xla(b, x, d1, d2):
        parts = [_dot(b, x, d, (5, 4), (0,), (0,)) for d in (d1, d2)]
        return b.op("concatenate", parts, (5, 8), "float32", {"dimension": 1})
    shapes = [(6, 5), (6, 4), (6, 4)]
    before, g = _normal(build, shapes)
    _agree(before, g, shapes)
    _, xla = _normal(build_xla, shapes)
    assert _form(g) == _form(xla)


@pytest.mark.parametrize("strides", [None, (1, 2, 1)])
def test_a_transposed_slice_is_the_slice_of_the_transpose(strides):
    def build(b, x):
        shape = (2, 2 if strides else 3, 4)
        s = b.op("slice", [x], shape, "float32", {"start_indices": (1, 0, 0),
                 "limit_indices": (3, 4 if strides else 3, 4), "strides": strides})
        return b.op("transpose", [s], (shape[2], shape[0], shape[1]), "float32",
                    {"permutation": (2, 0, 1)})
    g = _check(build, [(4, 5, 4)], set())
    assert [op.kind for op in g.ops] == ["transpose", "slice"]


@pytest.mark.parametrize("start", [1, 3])     # 3: clamped to 2 in its own dim
def test_a_transposed_dynamic_slice_is_the_dynamic_slice_of_the_transpose(start):
    def build(b, x):
        i = b.constant(np.int32(start), (), "int32")
        z = b.constant(np.int32(0), (), "int32")
        s = b.op("dynamic_slice", [x, z, i], (3, 2), "float32", {"slice_sizes": (3, 2)})
        return b.op("transpose", [s], (2, 3), "float32", {"permutation": (1, 0)})
    g, ids = _graph(build, [(3, 4)])
    before = copy.deepcopy(g)
    # (a dynamic slice at literal starts is a slice first: simplify_sink.literal_dynamic_slice)
    assert simplify_graph(g, ids)
    assert [op.kind for op in g.ops if op.kind != "constant"] == ["transpose", "slice"]
    _agree(before, g, [(3, 4)])


def test_a_transposed_dynamic_slice_at_a_rank_offset_is_the_dynamic_slice_of_the_transpose():
    # the all-to-all of Ulysses as a gather and a slice at the rank's offset
    def build(b, x):
        gathered = b.op("all_gather", [x], (4, 6), "float32", {"dimension": 0, "groups": [[0, 1]]})
        r = b.op("axis_index", [], (), "int32", {"axis": "_flat"})
        three = b.constant(np.int32(3), (), "int32")
        off = b.op("mul", [r, three], (), "int32")
        z = b.constant(np.int32(0), (), "int32")
        s = b.op("dynamic_slice", [gathered, z, off], (4, 3), "float32", {"slice_sizes": (4, 3)})
        return b.op("transpose", [s], (3, 4), "float32", {"permutation": (1, 0)})
    g, ids = _graph(build, [(2, 6)])
    before = copy.deepcopy(g)
    assert simplify_graph(g, ids)
    (ds,) = [op for op in g.ops if op.kind == "dynamic_slice"]
    assert ds.output == g.outputs[0] and ds.params["slice_sizes"] == (3, 4)
    _agree(before, g, [(2, 6)], ranks=2)


# --------------------------------------------------------------- broadcasts
@pytest.mark.parametrize("mid, out, dims, kept", [
    ((1, 8), (1, 8, 8), (0, 1), (1,)),       # the program's mask: iota reshaped to [1, n]
    ((1, 8), (3, 8, 8), (0, 2), (2,)),       # the size-1 dim repeated along a longer dim
    ((8, 1), (8, 4), (0, 1), (0,)),
    ((2, 1, 3), (3, 5, 2), (2, 1, 0), (2, 0)),  # dims out of order
])
def test_a_broadcast_of_inserted_size_1_dims_broadcasts_the_operand(mid, out, dims, kept):
    src = tuple(s for s in mid if s != 1)

    def build(b, x):
        r = b.op("reshape", [x], mid, "float32")
        return b.op("broadcast_in_dim", [r], out, "float32", {"broadcast_dimensions": dims})
    g = _check(build, [src], {"reshape"})
    assert tuple(g.ops[-1].params["broadcast_dimensions"]) == kept


def test_a_broadcast_of_a_merging_reshape_stays():
    def build(b, x):
        r = b.op("reshape", [x], (1, 8), "float32")
        return b.op("broadcast_in_dim", [r], (3, 8), "float32", {"broadcast_dimensions": (0, 1)})
    g, ids = _graph(build, [(2, 4)])
    assert not simplify_graph(g, ids)


# ------------------------------------------- broadcast tables under a transpose
def test_rope_s_table_broadcast_into_xla_s_layout_meets_the_program_s():
    # XLA rotates q as [b, g, s, j, d] (the cos table [s, d] broadcast along dims 2, 4)
    # and transposes the product to the program's [b, s, g, j, d]; the program
    # broadcasts the table along dims 1, 4 of its own layout
    shapes = [(2, 3, 5, 2, 4), (5, 4)]

    def xla(b, x, c):
        t = b.op("broadcast_in_dim", [c], (2, 3, 5, 2, 4), "float32", {"broadcast_dimensions": (2, 4)})
        m = b.op("mul", [x, t], (2, 3, 5, 2, 4), "float32")
        return b.op("transpose", [m], (2, 5, 3, 2, 4), "float32", {"permutation": (0, 2, 1, 3, 4)})

    def program(b, x, c):
        xt = b.op("transpose", [x], (2, 5, 3, 2, 4), "float32", {"permutation": (0, 2, 1, 3, 4)})
        t = b.op("broadcast_in_dim", [c], (2, 5, 3, 2, 4), "float32", {"broadcast_dimensions": (1, 4)})
        return b.op("mul", [xt, t], (2, 5, 3, 2, 4), "float32")
    g = _check(xla, shapes, set())
    _, other = _normal(program, shapes)
    assert _form(g) == _form(other)
    out = next(op for op in g.ops if op.output == g.outputs[0])
    assert out.kind == "mul"


def _table_transposed(b, x, c):
    # x [2, 3, 3] times the table [3, 3] along dims 1, 2, transposed by (0, 2, 1): the
    # table's dims swap, so the table is transposed to keep them in order
    t = b.op("broadcast_in_dim", [c], (2, 3, 3), "float32", {"broadcast_dimensions": (1, 2)})
    m = b.op("add", [x, t], (2, 3, 3), "float32")
    return b.op("transpose", [m], (2, 3, 3), "float32", {"permutation": (0, 2, 1)})


def test_a_table_whose_dims_the_transpose_swaps_is_transposed():
    g = _check(_table_transposed, [(2, 3, 3), (3, 3)], set())
    (bc,) = [op for op in g.ops if op.kind == "broadcast_in_dim"]
    assert tuple(bc.params["broadcast_dimensions"]) == (1, 2)
    assert next(op for op in g.ops if op.output == bc.inputs[0]).kind == "transpose"


def test_the_table_left_untransposed_is_another_function():
    # the rule twin: the broadcast's dims sorted but the table as it was; the shared
    # evaluator tells it from the program (the table [3, 3] is not symmetric)
    before, _ = _normal(_table_transposed, [(2, 3, 3), (3, 3)])

    def twin(b, x, c):
        xt = b.op("transpose", [x], (2, 3, 3), "float32", {"permutation": (0, 2, 1)})
        t = b.op("broadcast_in_dim", [c], (2, 3, 3), "float32", {"broadcast_dimensions": (1, 2)})
        return b.op("add", [xt, t], (2, 3, 3), "float32")
    wrong, _ = _normal(twin, [(2, 3, 3), (3, 3)])
    with pytest.raises(AssertionError):
        _agree(before, wrong, [(2, 3, 3), (3, 3)])


def test_a_table_s_op_read_elsewhere_keeps_its_layout():
    # a bias added, read by the next layer and transposed for a weight gradient: the
    # transpose stays over the one add
    def build(b, x, bias):
        t = b.op("broadcast_in_dim", [bias], (2, 3, 4), "float32", {"broadcast_dimensions": (2,)})
        a = b.op("add", [x, t], (2, 3, 4), "float32")
        tr = b.op("transpose", [a], (4, 2, 3), "float32", {"permutation": (2, 0, 1)})
        e = b.op("exp", [a], (2, 3, 4), "float32")
        return tr, e
    g, ids = _graph(lambda b, x, bias: build(b, x, bias)[0], [(2, 3, 4), (4,)])
    # (both values outputs: the add has two readers)
    g2, ids2 = _graph(lambda b, x, bias: build(b, x, bias)[0], [(2, 3, 4), (4,)])
    from dlverify.ir import GraphBuilder
    b = GraphBuilder(g2, ids2)
    a = next(op for op in g2.ops if op.kind == "add")
    g2.outputs.append(b.op("exp", [a.output], (2, 3, 4), "float32"))
    before = copy.deepcopy(g2)
    simplify_graph(g2, ids2)
    _agree(before, g2, [(2, 3, 4), (4,)])
    out = next(op for op in g2.ops if op.output == g2.outputs[0])
    assert out.kind == "transpose"
    assert len([op for op in g2.ops if op.kind == "add"]) == 1


# an HLO pair: the heads g split over 2 ranks; XLA rotates in [b, g, s, d] and
# transposes back, the program rotates in [b, s, g, d]
_SEQ_ROPE = """HloModule seq

ENTRY %main (x: f32[2,3,4,3], c: f32[3,3]) -> f32[2,3,4,3] {
  %x = f32[2,3,4,3]{3,2,1,0} parameter(0)
  %c = f32[3,3]{1,0} parameter(1)
  %t = f32[2,3,4,3]{3,2,1,0} broadcast(f32[3,3]{1,0} %c), dimensions={1,3}
  ROOT %y = f32[2,3,4,3]{3,2,1,0} multiply(f32[2,3,4,3]{3,2,1,0} %x, f32[2,3,4,3]{3,2,1,0} %t)
}
"""

_DIST_ROPE = """HloModule dist, num_partitions=2

ENTRY %main (x: f32[2,3,2,3], c: f32[3,3]) -> f32[2,3,2,3] {
  %x = f32[2,3,2,3]{3,2,1,0} parameter(0), sharding={devices=[1,1,2,1]0,1}
  %c = f32[3,3]{1,0} parameter(1), sharding={replicated}
  %xt = f32[2,2,3,3]{3,2,1,0} transpose(f32[2,3,2,3]{3,2,1,0} %x), dimensions={0,2,1,3}
  %ct = f32[3,3]{1,0} transpose(f32[3,3]{1,0} %c), dimensions=CT
  %t = f32[2,2,3,3]{3,2,1,0} broadcast(f32[3,3]{1,0} %ct), dimensions={2,3}
  %m = f32[2,2,3,3]{3,2,1,0} multiply(f32[2,2,3,3]{3,2,1,0} %xt, f32[2,2,3,3]{3,2,1,0} %t)
  ROOT %y = f32[2,3,2,3]{3,2,1,0} transpose(f32[2,2,3,3]{3,2,1,0} %m), dimensions={0,2,1,3}, sharding={devices=[1,1,2,1]0,1}
}
"""


def test_compiled_rope_in_xla_s_layout_verifies(tmp_path):
    res = verify_texts(tmp_path, _SEQ_ROPE, _DIST_ROPE.replace("CT", "{0,1}"))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert_views_hold(res.problem, res.views, seeds=(0,), padded=res.padded_views)


def test_its_twin_reading_the_table_transposed_is_located_at_the_transpose(tmp_path):
    dist = _DIST_ROPE.replace("CT", "{1,0}")
    res = verify_texts(tmp_path, _SEQ_ROPE, dist)
    assert not res.verified
    line = next(i for i, text in enumerate(dist.splitlines(), 1) if "%ct = " in text)
    assert res.failures[0].line == line, [(f.op, f.line, f.message[:120]) for f in res.failures]


# ------------------------------------------- the fused gate/up weight's gradient
# h [b, s, d]; the cotangents of the gate and up projections g, u [b, s, f]. The program's
# JAX lowering computes the fused [d, 2, f] weight's gradient piece by piece: g^T h,
# [f, d], reshaped to [f, 1, d] and transposed to [d, 1, f], beside u's, concatenated;
# XLA computes h^T concat(g, u) (the concatenation along a free dim of the dot's rhs)
_HB, _HS, _HD, _HF = 2, 3, 4, 5


def _w13_program(b, h, g, u):
    parts = []
    for c in (g, u):
        dot = _dot(b, c, h, (_HF, _HD), (0, 1), (0, 1))
        r = b.op("reshape", [dot], (_HF, 1, _HD), "float32")
        parts.append(b.op("transpose", [r], (_HD, 1, _HF), "float32", {"permutation": (2, 1, 0)}))
    return b.op("concatenate", parts, (_HD, 2, _HF), "float32", {"dimension": 1})


def _w13_xla(b, h, g, u, order=(0, 1)):
    pieces = [b.op("reshape", [c], (_HB, _HS, 1, _HF), "float32") for c in (g, u)]
    cat = b.op("concatenate", [pieces[k] for k in order], (_HB, _HS, 2, _HF), "float32",
               {"dimension": 2})
    ht = b.op("transpose", [h], (_HD, _HB, _HS), "float32", {"permutation": (2, 0, 1)})
    return _dot(b, ht, cat, (_HD, 2, _HF), (1, 2), (0, 1))


_W13 = [(_HB, _HS, _HD), (_HB, _HS, _HF), (_HB, _HS, _HF)]


def test_the_fused_gate_up_weight_gradient_meets_the_program_s_pieces():
    before, program = _normal(_w13_program, _W13)
    before_xla, xla = _normal(_w13_xla, _W13)
    _agree(before, program, _W13)
    _agree(before_xla, xla, _W13)
    assert _form(program) == _form(xla)
    out = next(op for op in xla.ops if op.output == xla.outputs[0])
    assert out.kind == "concatenate" and out.params["dimension"] == 1


def test_the_fused_gradient_with_its_pieces_swapped_is_another_function():
    # the rule twin: the pieces concatenated in the other order; the shared evaluator
    # tells it from the program, and its form is not the program's
    def swapped(b, h, g, u):
        return _w13_xla(b, h, g, u, order=(1, 0))
    before, program = _normal(_w13_program, _W13)
    before_twin, twin = _normal(swapped, _W13)
    assert _form(program) != _form(twin)
    with pytest.raises(AssertionError):
        _agree(before, before_twin, _W13)


@pytest.mark.parametrize("side", [0, 1])
def test_a_dot_over_a_concatenation_along_a_free_dim_is_the_concatenation_of_the_dots(side):
    # x [3, 4] contracted with the concatenation of y1 [4, 2] and y2 [4, 5] along its
    # free dim, as either operand: one dot per piece, concatenated along the result's dim
    def build(b, x, y1, y2):
        if side:
            cat = b.op("concatenate", [y1, y2], (4, 7), "float32", {"dimension": 1})
            return _dot(b, x, cat, (3, 7), (1,), (0,))
        t1, t2 = (b.op("transpose", [y], (y_n, 4), "float32", {"permutation": (1, 0)})
                  for y, y_n in ((y1, 2), (y2, 5)))
        cat = b.op("concatenate", [t1, t2], (7, 4), "float32", {"dimension": 0})
        return _dot(b, cat, x, (7, 3), (1,), (1,))
    g = _check(build, [(3, 4), (4, 2), (4, 5)], set())
    out = next(op for op in g.ops if op.output == g.outputs[0])
    assert out.kind == "concatenate" and out.params["dimension"] == side
    assert all(next(op for op in g.ops if op.output == t).kind == "dot_general"
               for t in out.inputs)


def test_a_dot_over_a_concatenation_along_a_contracted_dim_stays():
    # (the sum of the pieces' dots: split only where the programs disagree,
    # rewrites.split_contracted_concatenations)
    def build(b, x1, x2, w):
        cat = b.op("concatenate", [x1, x2], (3, 7), "float32", {"dimension": 1})
        return _dot(b, cat, w, (3, 5), (1,), (0,))
    g, ids = _graph(build, [(3, 2), (3, 5), (7, 5)])
    simplify_graph(g, ids)
    out = next(op for op in g.ops if op.output == g.outputs[0])
    assert out.kind == "dot_general"
    assert next(op for op in g.ops if op.output == out.inputs[0]).kind == "concatenate"


def test_a_transpose_of_size_1_dims_inserted_into_a_dot_is_the_transposed_dot():
    # transpose(reshape(g^T h, [f, 1, d]), (2, 1, 0)): the swapped dot h^T g, then the
    # reshape inserting the size-1 dim
    def build(b, h, g):
        dot = _dot(b, g, h, (_HF, _HD), (0, 1), (0, 1))
        r = b.op("reshape", [dot], (_HF, 1, _HD), "float32")
        return b.op("transpose", [r], (_HD, 1, _HF), "float32", {"permutation": (2, 1, 0)})
    g = _check(build, [(_HB, _HS, _HD), (_HB, _HS, _HF)], set())
    out = next(op for op in g.ops if op.output == g.outputs[0])
    assert out.kind == "reshape"     # (h read as h^T [d, b, s]: dot_layout's operand order)
    dot = next(op for op in g.ops if op.output == out.inputs[0])
    assert dot.kind == "dot_general" and g.tensors[dot.output].shape == (_HD, _HF)


def test_a_transpose_of_size_1_dims_inserted_into_an_elementwise_op_stays():
    # nothing under the reshape takes the transpose: it stays where it is
    def build(b, x):
        e = b.op("exp", [x], (5, 4), "float32")
        r = b.op("reshape", [e], (5, 1, 4), "float32")
        return b.op("transpose", [r], (4, 1, 5), "float32", {"permutation": (2, 1, 0)})
    g, ids = _graph(build, [(5, 4)])
    simplify_graph(g, ids)
    out = next(op for op in g.ops if op.output == g.outputs[0])
    assert out.kind == "transpose"


# an HLO pair: the batch split over 2 ranks (data parallel), XLA's fused gradient reduced
_SEQ_W13 = """HloModule seq

ENTRY %main (h: f32[2,3,4], g: f32[2,3,5], u: f32[2,3,5]) -> f32[4,2,5] {
  %h = f32[2,3,4]{2,1,0} parameter(0)
  %g = f32[2,3,5]{2,1,0} parameter(1)
  %u = f32[2,3,5]{2,1,0} parameter(2)
  %dg = f32[5,4]{1,0} dot(f32[2,3,5]{2,1,0} %g, f32[2,3,4]{2,1,0} %h), lhs_contracting_dims={0,1}, rhs_contracting_dims={0,1}
  %rg = f32[5,1,4]{2,1,0} reshape(f32[5,4]{1,0} %dg)
  %tg = f32[4,1,5]{2,1,0} transpose(f32[5,1,4]{2,1,0} %rg), dimensions={2,1,0}
  %du = f32[5,4]{1,0} dot(f32[2,3,5]{2,1,0} %u, f32[2,3,4]{2,1,0} %h), lhs_contracting_dims={0,1}, rhs_contracting_dims={0,1}
  %ru = f32[5,1,4]{2,1,0} reshape(f32[5,4]{1,0} %du)
  %tu = f32[4,1,5]{2,1,0} transpose(f32[5,1,4]{2,1,0} %ru), dimensions={2,1,0}
  ROOT %w = f32[4,2,5]{2,1,0} concatenate(f32[4,1,5]{2,1,0} %tg, f32[4,1,5]{2,1,0} %tu), dimensions={1}
}
"""

_DIST_W13 = """HloModule dist, num_partitions=2

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (h: f32[1,3,4], g: f32[1,3,5], u: f32[1,3,5]) -> f32[4,2,5] {
  %h = f32[1,3,4]{2,1,0} parameter(0), sharding={devices=[2,1,1]0,1}
  %g = f32[1,3,5]{2,1,0} parameter(1), sharding={devices=[2,1,1]0,1}
  %u = f32[1,3,5]{2,1,0} parameter(2), sharding={devices=[2,1,1]0,1}
  %g4 = f32[1,3,1,5]{3,2,1,0} reshape(f32[1,3,5]{2,1,0} %g)
  %u4 = f32[1,3,1,5]{3,2,1,0} reshape(f32[1,3,5]{2,1,0} %u)
  %gu = f32[1,3,2,5]{3,2,1,0} concatenate(f32[1,3,1,5]{3,2,1,0} FIRST, f32[1,3,1,5]{3,2,1,0} SECOND), dimensions={2}
  %gut = f32[2,1,3,5]{3,2,1,0} transpose(f32[1,3,2,5]{3,2,1,0} %gu), dimensions={2,0,1,3}
  %ht = f32[4,1,3]{2,1,0} transpose(f32[1,3,4]{2,1,0} %h), dimensions={2,0,1}
  %p = f32[4,2,5]{2,1,0} dot(f32[4,1,3]{2,1,0} %ht, f32[2,1,3,5]{3,2,1,0} %gut), lhs_contracting_dims={1,2}, rhs_contracting_dims={1,2}
  ROOT %w = f32[4,2,5]{2,1,0} all-reduce(f32[4,2,5]{2,1,0} %p), replica_groups={{0,1}}, use_global_device_ids=true, channel_id=1, to_apply=%sum
}
"""


def test_compiled_fused_gate_up_gradient_verifies(tmp_path):
    # (XLA's concatenation read through a transpose: the dot meets it in the normal form)
    res = verify_texts(tmp_path, _SEQ_W13,
                       _DIST_W13.replace("FIRST", "%g4").replace("SECOND", "%u4"))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert res.outputs == ["out0 = r0.out0  (replicated on all 2 ranks)"]
    assert_views_hold(res.problem, res.views, seeds=(0,), padded=res.padded_views)


def test_its_twin_concatenating_up_before_gate_is_located_at_the_concatenation(tmp_path):
    dist = _DIST_W13.replace("FIRST", "%u4").replace("SECOND", "%g4")
    res = verify_texts(tmp_path, _SEQ_W13, dist)
    assert not res.verified
    line = next(i for i, text in enumerate(dist.splitlines(), 1) if "%gu = " in text)
    assert res.failures[0].line == line, [(f.op, f.line, f.message[:120]) for f in res.failures]


# ------------------------------------------------------------- compiled examples
def test_compiled_allgather_kv_gradients_verify_and_the_summed_loss_twin_is_located(tmp_path):
    cp = example_module("context_parallel_allgather_kv")
    assert_compiled_case_and_twin(tmp_path, cp.cp_allgather_kv_grads(),
                                  cp.cp_bug_loss_summed_over_cp(), dumped=True)


def test_compiled_ulysses_gradients_verify_and_their_twins_do_not(tmp_path):
    # the program's dq^T = k^T ds^T transposed to [q, h, d] meets XLA's dq = ds k [h, q, d]
    # gathered and transposed alike (a transpose moving the batch dim h left after each)
    u = example_module("ulysses_attention")
    res = verify_texts(tmp_path, *compiled_pair(u.ulysses_grads()))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert_views_hold(res.problem, res.views, seeds=(0,), padded=res.padded_views)
    assert_compiled_case_and_twin(tmp_path, u.ulysses_causal_attention(),
                                  u.ulysses_bug_back_all_to_all_wrong_concat_axis())
    twin = u.ulysses_bug_grad_over_scaled_by_sp()
    assert not verify_texts(tmp_path, *compiled_pair(twin)).verified


@pytest.mark.parametrize("case", ["gspmd_llama_fsdp_train", "gspmd_llama_fsdp_tp_train"])
def test_compiled_llama_fsdp_training_steps_verify(tmp_path, case):
    # grouped attention's v^T p^T and p v meet (one orientation per dot, the program's
    # where a rank's head of one reads otherwise: dlverify/dot_orientation.py), the fused
    # gate/up weight's gradient meets the program's pieces, and RoPE's tables broadcast
    # into XLA's rotation layout meet the program's (each a false alarm before)
    c = getattr(example_module("gspmd_jit"), case)()
    res = verify_texts(tmp_path, *compiled_pair(c))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert_views_hold(res.problem, res.views, seeds=(0,), padded=res.padded_views)


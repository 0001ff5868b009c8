"""dlverify/rewrites.py: the exact rewrites (dot through concatenate, slice of
concatenate) compute the same outputs as the programs they replace, on random
data; and they let the rules relate a fused QKV weight to its segments."""
import copy
from dataclasses import dataclass

import numpy as np
import pytest
from rulekit import Tiny

from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.rewrites import rewrite_graph

DOT = dict(lhs_contract=(0,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def run(g: Graph, inputs):
    vals = Interpreter(g, 1).run([[x] for x in inputs])
    return [vals[t][0] for t in g.outputs]


def check_same(g: Graph, ids: IdAllocator, seed: int = 0) -> Graph:
    """Rewrite a copy of g; both compute the same outputs on random inputs."""
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal(g.tensors[t].shape) for t in g.inputs]
    before = run(g, inputs)
    h = copy.deepcopy(g)
    assert rewrite_graph(h, ids)
    after = run(h, inputs)
    for a, b in zip(before, after):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    return h


def graph():
    """An empty program, its builder, and the id allocator the rewrites take new ids from."""
    ids = IdAllocator()
    g = Graph("g")
    return g, GraphBuilder(g, ids), ids


def inp(g, b, shape):
    t = b.tensor(shape, "float64")
    g.inputs.append(t)
    return t


@dataclass(frozen=True)
class Concat:
    """A concatenate of fresh inputs: the input pieces, in order, and its result."""
    pieces: list[int]
    out: int


def concat_of_inputs(g, b, shapes, dim) -> Concat:
    pieces = [inp(g, b, shape) for shape in shapes]
    out_shape = list(shapes[0])
    out_shape[dim] = sum(shape[dim] for shape in shapes)
    out = b.op("concatenate", pieces, tuple(out_shape), "float64", {"dimension": dim})
    return Concat(pieces, out)


def kinds(g):
    return [op.kind for op in g.ops]


def test_dot_through_rhs_concat_then_slices_read_the_pieces():
    g, b, ids = graph()
    x = inp(g, b, (5, 3))
    fused = concat_of_inputs(g, b, [(5, 4), (5, 2), (5, 2)], 1)
    a, c, w = fused.pieces[0], fused.pieces[1], fused.out
    y = b.op("dot_general", [x, w], (3, 8), "float64", DOT)
    q = b.op("slice", [y], (3, 4), "float64", {"start_indices": (0, 0), "limit_indices": (3, 4),
                                                "strides": None})
    k = b.op("slice", [y], (3, 2), "float64", {"start_indices": (0, 4), "limit_indices": (3, 6),
                                                "strides": None})
    v = b.op("slice", [y], (2, 2), "float64", {"start_indices": (1, 6), "limit_indices": (3, 8),
                                                "strides": None})
    g.outputs = [q, k, v]
    h = check_same(g, ids)
    # three dots of the pieces; q and k are two of them, v a row slice of the third;
    # the concatenates (the weight and the product) are gone
    assert sorted(kinds(h)) == ["dot_general"] * 3 + ["slice"]
    prod = {op.output: op for op in h.ops}
    assert prod[h.outputs[0]].kind == "dot_general" and prod[h.outputs[0]].inputs == [x, a]
    assert prod[h.outputs[1]].inputs == [x, c]


def test_dot_through_lhs_concat_and_a_slice_across_pieces():
    g, b, ids = graph()
    x = concat_of_inputs(g, b, [(3, 4), (3, 2)], 1).out
    w = inp(g, b, (3, 5))
    y = b.op("dot_general", [x, w], (6, 5), "float64", DOT)
    z = b.op("slice", [y], (3, 5), "float64", {"start_indices": (2, 0), "limit_indices": (5, 5),
                                                "strides": None})
    g.outputs = [z, y]
    h = check_same(g, ids)
    assert kinds(h).count("dot_general") == 2


def test_concat_along_a_batch_dim_is_left_alone():
    # (along a contracted dim it is a sum of the pieces' dots: tests/test_concat_contractions.py)
    g, b, ids = graph()
    w = concat_of_inputs(g, b, [(2, 4, 3), (2, 4, 3)], 0).out
    x = inp(g, b, (4, 4, 5))
    y = b.op("dot_general", [x, w], (4, 5, 3), "float64",
             dict(lhs_contract=(1,), rhs_contract=(1,), lhs_batch=(0,), rhs_batch=(0,)))
    g.outputs = [y]
    assert not rewrite_graph(copy.deepcopy(g), ids)


def test_strided_slice_is_left_alone_and_dead_ops_of_the_program_are_kept():
    g, b, ids = graph()
    pair = concat_of_inputs(g, b, [(4,), (4,)], 0)
    a, c, x = pair.pieces[0], pair.pieces[1], pair.out
    s = b.op("slice", [x], (4,), "float64", {"start_indices": (0,), "limit_indices": (8,),
                                              "strides": (2,)})
    dead = b.op("neg", [a], (4,), "float64")
    g.outputs = [s]
    assert not rewrite_graph(g, ids)
    t = b.op("slice", [x], (4,), "float64", {"start_indices": (4,), "limit_indices": (8,),
                                              "strides": None})
    g.outputs = [s, t]
    h = check_same(g, ids)
    assert dead in {op.output for op in h.ops}          # dead before: kept
    assert h.outputs[1] == c                             # the slice is the second operand


@pytest.mark.parametrize("segments", [(4, 2, 2), (8, 4, 4)])
def test_fused_qkv_segments_meet_through_the_rewrite(segments):
    """The fused QKV weight of the Neuron files, in small: each rank holds its
    share of every segment, concatenated; the product is sliced back into Q, K, V."""
    n = 2
    t = Tiny(mesh=Mesh(("x",), (n,)))
    xs, xd = t.input((6, 5))
    segs = [t.input((6, s), (None, "x")) for s in segments]
    total = sum(segments)
    ws = t.sop("concatenate", [s for s, _ in segs], (6, total), dimension=1)
    wd = t.dop("concatenate", [d for _, d in segs], (6, total // n), dimension=1)
    ys = t.sop("dot_general", [xs, ws], (5, total), **DOT)
    yd = t.dop("dot_general", [xd, wd], (5, total // n), **DOT)
    off_s = off_d = 0
    for size in segments:
        ps = t.sop("slice", [ys], (5, size), start_indices=(0, off_s), limit_indices=(5, off_s + size),
                   strides=None)
        pd = t.dop("slice", [yd], (5, size // n), start_indices=(0, off_d),
                   limit_indices=(5, off_d + size // n), strides=None)
        t.output(ps, pd, (None, "x"))
        off_s += size
        off_d += size // n
    out = t.run()
    assert out.result.verified, out.result.failures
    assert out.result.outputs[1] == "out1 = concat(r0.out1, r1.out1; dim 1)"


def test_fused_qkv_with_a_wrong_slice_offset_is_not_verified():
    """The Entangle broken graph in small: the distributed Q slice reads columns
    shifted by a quarter of its width (part Q, part K)."""
    t = Tiny()
    xs, xd = t.input((6, 5))
    segs = [t.input((6, s), (None, "x")) for s in (8, 4, 4)]
    ws = t.sop("concatenate", [s for s, _ in segs], (6, 16), dimension=1)
    wd = t.dop("concatenate", [d for _, d in segs], (6, 8), dimension=1)
    ys = t.sop("dot_general", [xs, ws], (5, 16), **DOT)
    yd = t.dop("dot_general", [xd, wd], (5, 8), **DOT)
    qs = t.sop("slice", [ys], (5, 8), start_indices=(0, 0), limit_indices=(5, 8), strides=None)
    qd = t.dop("slice", [yd], (5, 4), start_indices=(0, 1), limit_indices=(5, 5), strides=None)
    t.output(qs, qd, (None, "x"))
    out = t.run()
    assert not out.result.verified


@pytest.mark.parametrize("cfg", [((1, 2, 0), (0, 0, 0), (3, 0, 1)), ((0, 0, 0), (2, 1, 0), (0, 0, 0))])
def test_a_pad_of_a_transpose_pads_in_the_operands_layout(cfg):
    """pad(transpose(x)) = transpose(pad(x)), the config moved to x's dims (interior
    padding too): XLA pads a convolution's operand after transposing it to its
    layout, the program before."""
    g, b, ids = graph()
    x = inp(g, b, (2, 3, 4))
    t = b.op("transpose", [x], (4, 2, 3), "float64", {"permutation": (2, 0, 1)})
    zero = b.constant(np.zeros(()), (), "float64")
    out = tuple(lo + (n - 1) * (it + 1) + 1 + hi for n, (lo, hi, it) in zip((4, 2, 3), cfg))
    p = b.op("pad", [t, zero], out, "float64", {"padding_config": cfg})
    g.outputs = [p]
    h = check_same(g, ids)
    assert kinds(h)[-2:] == ["pad", "transpose"]
    assert h.ops[-2].inputs[0] == x

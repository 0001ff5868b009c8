"""Transposes a layout choice puts around elementwise ops, pads, broadcasts and
reductions (dlverify/simplify_transposes.py): each rewrite leaves the outputs unchanged
on random data (the shared evaluator) and fires; XLA's NHWC form of a batch statistic
and the program's NCHW one reach one form; a tree whose transposes differ stays; and
the convolutions of examples/conv_parallel.py, as XLA compiles them (NHWC), verify while
their buggy twins are located; a relu gradient's mask takes the transposes too."""
import copy

import numpy as np
import pytest
from hlo_pairs import assert_compiled_case_and_twin, compiled_pair, example_module, verify_texts
from test_simplify import _check, _graph, _splat
from test_simplify_layouts import _agree, _form, _normal

from dlverify.ops.semantics import NotExecutable
from dlverify.simplify import simplify_graph

F = "float32"


def _t(b, x, shape, perm):
    return b.op("transpose", [x], tuple(shape[p] for p in perm), F, {"permutation": perm})


def test_a_transposed_pad_is_the_pad_of_the_transpose():
    def build(b, x):
        p = b.op("pad", [x, b.constant(np.float32(0.5), (), F)], (2, 5, 8), F,
                 {"padding_config": ((0, 0, 0), (1, 1, 0), (2, 1, 1))})
        return _t(b, p, (2, 5, 8), (0, 2, 1))
    g = _check(build, [(2, 3, 3)], set())
    (pad,) = [op for op in g.ops if op.kind == "pad"]
    assert pad.output == g.outputs[0] and pad.params["padding_config"][1] == (2, 1, 1)


def _taps(b, x, w):
    """A convolution's tap as its expansion writes it: [n, h, w, k] x [k, c] -> [n, h, w, c]."""
    shape = b.graph.tensors[x].shape[:3] + (b.graph.tensors[w].shape[1],)
    return b.op("dot_general", [x, w], shape, F, {"lhs_contract": (3,), "rhs_contract": (0,),
                                                  "lhs_batch": (), "rhs_batch": ()})


_NHWC = (2, 3, 3, 4)
_TO_NCHW = (0, 3, 1, 2)
_X, _W = (2, 3, 3, 5), (5, 4)


@pytest.mark.parametrize("kind", ["add", "max", "sub"])
def test_a_transposed_elementwise_op_of_several_tensors_takes_the_transpose(kind):
    # XLA's NHWC y = s1 + s2 transposed to NCHW at the end; the program's NCHW tensors
    # transposed from NHWC taps (which stay transposed: no dot computes NCHW whole)
    def build(b, x, w, z):
        s1, s2 = _taps(b, x, w), _t(b, z, (2, 4, 3, 3), (0, 2, 3, 1))    # z is NCHW
        return _t(b, b.op(kind, [s1, s2], _NHWC, F), _NHWC, _TO_NCHW)
    g = _check(build, [_X, _W, (2, 4, 3, 3)], set())
    producer = {op.output: op for op in g.ops}
    assert producer[g.outputs[0]].kind == kind      # the transposes went into its operands
    assert [op.kind for op in g.ops].count("transpose") == 1     # on the taps' dot only


def test_a_transpose_of_an_elementwise_op_of_dots_that_take_it_of_inputs_or_of_masks_stays():
    # a rank-2 MLP's swapped dots: moving the transpose into them would swap dot after dot
    def dots(b, x, w, v):
        d1 = b.op("dot_general", [x, w], (3, 5), F, {"lhs_contract": (1,), "rhs_contract": (0,),
                                                      "lhs_batch": (), "rhs_batch": ()})
        d2 = b.op("dot_general", [x, v], (3, 5), F, {"lhs_contract": (1,), "rhs_contract": (0,),
                                                      "lhs_batch": (), "rhs_batch": ()})
        return _t(b, b.op("mul", [d1, d2], (3, 5), F), (3, 5), (1, 0))

    def inputs(b, x, y):
        return _t(b, b.op("add", [x, y], _NHWC, F), _NHWC, _TO_NCHW)

    def mask(b, x, w, z):      # a select on a mask of indices (a MoE dispatch's one-hot)
        s1, s2 = _taps(b, x, w), _t(b, z, (2, 4, 3, 3), (0, 2, 3, 1))
        return _t(b, b.op("select_n", [_index_mask(b), s1, s2], _NHWC, F), _NHWC, _TO_NCHW)

    def broadcasts(b, g, e):   # on broadcasts alone (a MoE gate's dispatch weights)
        bg = b.op("broadcast_in_dim", [g], _NHWC, F, {"broadcast_dimensions": (0, 3)})
        be = b.op("broadcast_in_dim", [e], _NHWC, F, {"broadcast_dimensions": (1, 2)})
        return _t(b, b.op("mul", [bg, be], _NHWC, F), _NHWC, _TO_NCHW)
    for build, shapes in ((dots, [(3, 4), (4, 5), (4, 5)]), (inputs, [_NHWC, _NHWC]),
                          (mask, [_X, _W, (2, 4, 3, 3)]), (broadcasts, [(2, 4), (3, 3)])):
        g, ids = _graph(build, shapes)
        simplify_graph(g, ids)
        producer = {op.output: op for op in g.ops}
        assert producer[g.outputs[0]].kind == "transpose"


def _index_mask(b):
    """iota along dim 1 == iota along dim 3, at _NHWC: a one-hot of positions."""
    def iota(d):
        i = b.op("iota", [], (_NHWC[d],), "int32", {"dimension": 0})
        return b.op("broadcast_in_dim", [i], _NHWC, "int32", {"broadcast_dimensions": (d,)})
    return b.op("eq", [iota(1), iota(3)], _NHWC, "bool")


def _relu_grad(b, y, shape):
    """A relu's gradient as jax writes it: select(y > 0, relu(y) * 0.5, 0)."""
    zero = _splat(b, 0.0, shape)
    mask = b.op("gt", [y, zero], shape, "bool")
    scaled = b.op("mul", [b.op("max", [y, zero], shape, F), _splat(b, 0.5, shape)], shape, F)
    return b.op("select_n", [mask, zero, scaled], shape, F)


def _kernel_grad(b, x, g):
    """The taps' kernel gradient: x [n, h, w, k] contracted with g [n, h, w, c]."""
    shape = (b.graph.tensors[x].shape[3], b.graph.tensors[g].shape[3])
    return b.op("dot_general", [x, g], shape, F, {"lhs_contract": (0, 1, 2), "rhs_contract": (0, 1, 2),
                                                  "lhs_batch": (), "rhs_batch": ()})


def test_a_transposed_select_on_a_mask_of_values_takes_the_transpose_into_the_mask():
    # the program's relu gradient in NCHW, transposed to the NHWC its kernel gradient's
    # dot reads; XLA computes it in NHWC from the taps themselves
    def program(b, x, w):
        y = _t(b, _taps(b, x, w), _NHWC, _TO_NCHW)
        return _kernel_grad(b, x, _t(b, _relu_grad(b, y, (2, 4, 3, 3)), (2, 4, 3, 3), (0, 2, 3, 1)))

    def xla(b, x, w):
        return _kernel_grad(b, x, _relu_grad(b, _taps(b, x, w), _NHWC))
    g = _check(program, [_X, _W], set())
    producer = {op.output: op for op in g.ops}
    (gt,) = [op for op in g.ops if op.kind == "gt"]
    assert producer[gt.inputs[0]].kind == "dot_general"     # the transposes composed away
    _, x = _normal(xla, [_X, _W])
    assert _form(g) == _form(x)


def test_a_transposed_select_on_a_mask_of_values_left_in_place_is_caught(monkeypatch):
    # the buggy twin of the rule: the mask not transposed with the values (c, h and w
    # of one size, so the shapes fit and the values differ)
    from dlverify import simplify_transposes
    moved = simplify_transposes._moved
    monkeypatch.setattr(simplify_transposes, "_moved",
                        lambda s, t, perm, op: t if s.g.tensors[t].dtype == "bool" else moved(s, t, perm, op))

    cube = (2, 3, 3, 3)

    def build(b, x, w):
        y = _t(b, _taps(b, x, w), cube, _TO_NCHW)
        return _kernel_grad(b, x, _t(b, _relu_grad(b, y, cube), cube, (0, 2, 3, 1)))
    before, g = _normal(build, [_X, (5, 3)])
    producer = {op.output: op for op in g.ops}
    assert producer[producer[g.outputs[0]].inputs[1]].kind == "select_n"     # (it fired)
    with pytest.raises(AssertionError):
        _agree(before, g, [_X, (5, 3)])


def test_a_transposed_broadcast_broadcasts_the_operand_in_the_new_order():
    def build(b, m):
        bc = b.op("broadcast_in_dim", [m], (3, 5, 4), F, {"broadcast_dimensions": (0, 2)})
        return _t(b, bc, (3, 5, 4), (2, 1, 0))
    g = _check(build, [(3, 4)], set())
    producer = {op.output: op for op in g.ops}
    out = producer[g.outputs[0]]
    assert out.kind == "broadcast_in_dim" and out.params["broadcast_dimensions"] == (0, 2)
    assert producer[out.inputs[0]].kind == "transpose"      # m as [4, 3]


# the batch mean and variance of a conv's result: the program's NCHW y = transpose(s), XLA's s
def _variance(b, y, axes, channel):
    shape = b.graph.tensors[y].shape
    mean = b.op("reduce_sum", [y], (4,), F, {"axes": axes})
    centred = b.op("sub", [y, b.op("broadcast_in_dim", [mean], shape, F,
                                   {"broadcast_dimensions": (channel,)})], shape, F)
    sq = b.op("mul", [centred, centred], shape, F)
    return b.op("reduce_sum", [sq], (4,), F, {"axes": axes})


def test_a_reduction_of_a_transposed_tree_reads_the_untransposed_tree():
    def program(b, x, w):     # NCHW: the statistics over (n, h, w)
        return _variance(b, _t(b, _taps(b, x, w), _NHWC, _TO_NCHW), (0, 2, 3), 1)

    def xla(b, x, w):         # NHWC: over (n, h, w) too, the channel last
        return _variance(b, _taps(b, x, w), (0, 1, 2), 3)
    before, g = _normal(program, [_X, _W])
    _agree(before, g, [_X, _W])
    assert "transpose" not in {op.kind for op in g.ops}
    _, x = _normal(xla, [_X, _W])
    assert _form(g) == _form(x)


def test_a_reduction_keeping_transposed_dims_transposes_its_result():
    def build(b, x, w):       # sum over w of the NCHW view: [n, c, h], XLA's [n, h, c] transposed
        y = _t(b, _taps(b, x, w), _NHWC, _TO_NCHW)
        return b.op("reduce_sum", [b.op("exp", [y], (2, 4, 3, 3), F)], (2, 4, 3), F, {"axes": (3,)})
    g = _check(build, [_X, _W], set())
    producer = {op.output: op for op in g.ops}
    out = producer[g.outputs[0]]
    assert out.kind == "transpose" and producer[out.inputs[0]].params["axes"] == (2,)


def test_a_reduction_of_a_tree_of_two_transposes_or_of_an_untransposed_tensor_stays():
    def two(b, x, w, z):
        e = b.op("add", [_t(b, _taps(b, x, w), _NHWC, _TO_NCHW),
                         _t(b, _taps(b, x, w), _NHWC, (0, 3, 2, 1))], (2, 4, 3, 3), F)
        return b.op("reduce_sum", [e], (4,), F, {"axes": (0, 2, 3)})

    def mixed(b, x, w, z):
        e = b.op("add", [_t(b, _taps(b, x, w), _NHWC, _TO_NCHW), z], (2, 4, 3, 3), F)
        return b.op("reduce_sum", [e], (4,), F, {"axes": (0, 2, 3)})
    for build in (two, mixed):
        g, ids = _graph(build, [_X, _W, (2, 4, 3, 3)])
        before = copy.deepcopy(g)
        simplify_graph(g, ids)
        _agree(before, g, [_X, _W, (2, 4, 3, 3)])
        assert "transpose" in {op.kind for op in g.ops}


def test_a_reduction_rebuilt_with_the_permutation_not_inverted_is_caught(monkeypatch):
    # the buggy twin of the rule: each dim placed where P takes it from, not where P puts
    # it (the same for a permutation that is its own inverse, not for NHWC -> NCHW)
    from dlverify import simplify_transposes
    monkeypatch.setattr(simplify_transposes, "inverse", lambda perm: list(perm))

    def build(b, x, w):
        y = b.op("exp", [_t(b, _taps(b, x, w), _NHWC, _TO_NCHW)], (2, 4, 3, 3), F)
        return b.op("reduce_sum", [y], (2, 4, 3), F, {"axes": (3,)})
    before, g = _normal(build, [_X, _W])
    with pytest.raises((AssertionError, NotExecutable)):     # (values differ, or shapes)
        _agree(before, g, [_X, _W])


# ------------------------------------------------------------- compiled examples
def test_compiled_channel_parallel_convs_verify_and_the_local_fan_in_twin_is_located(tmp_path):
    conv = example_module("conv_parallel")
    assert_compiled_case_and_twin(tmp_path, conv.conv_channel_parallel(),
                                  conv.conv_channel_parallel_bug_local_fan_in())
    res = verify_texts(tmp_path, *compiled_pair(conv.conv_pool_channel_parallel()))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert not verify_texts(tmp_path, *compiled_pair(
        conv.conv_channel_parallel_bug_missing_psum())).verified


def test_compiled_sync_batch_norm_verifies_and_the_unsynced_twin_is_located(tmp_path):
    conv = example_module("conv_parallel")
    assert_compiled_case_and_twin(tmp_path, conv.conv_data_parallel_sync_bn(),
                                  conv.conv_data_parallel_bug_unsynced_bn())


def test_compiled_channel_parallel_conv_gradients_verify(tmp_path):
    # the relu gradient's mask reads NHWC in XLA's module, NCHW in the program's
    conv = example_module("conv_parallel")
    res = verify_texts(tmp_path, *compiled_pair(conv.conv_channel_parallel_grads()))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]

"""dlverify/partial_tags.py: full_size sizes the families the tag axis codes name, and
any other code (an axis past an op's dims or operands, an op the graph lacks, a
re-indexing of a flattened pair) is None, never an exception: diagnosis sizes
the tag of every view it reads (Judge._gaps)."""
from test_simplify import _dot

from dlverify import partial_tags as T
from dlverify.ir import Graph, GraphBuilder, IdAllocator


def test_full_size_decodes_every_axis_code_without_an_exception():
    # a dot contracting (2, 8) and a reduction of its result: the families they name
    g = Graph("sequential")
    b = GraphBuilder(g, IdAllocator())
    x, y = b.tensor((5, 2, 8), "float32"), b.tensor((2, 8, 3), "float32")
    out = _dot(b, x, y, (5, 3), (1, 2), (0, 1))
    b.op("reduce_sum", [out], (3,), "float32", {"axes": (0,)})
    b.op("add", [out, out], (5, 3), "float32", {})
    dot_id, red_id, add_id = (op.id for op in g.ops)
    assert T.full_size(g, dot_id, 0) == 2 and T.full_size(g, dot_id, 1) == 8
    assert T.full_size(g, dot_id, T.FLAT_BASE + T.PAIR * 0 + 1) == 16
    assert T.full_size(g, dot_id, T.trans_axis(1, 4, 2)) == 8
    assert T.full_size(g, red_id, 0) == 5 and T.full_size(g, red_id, T.ACC_BASE) == 5
    assert T.full_size(g, red_id, T.MASK_BASE) == 3
    assert T.full_size(g, red_id, T.ADD_BASE) is None     # a reduction has no operand 1
    # an add of two reductions' results: gcd of their sizes (8 and 2; 2 and 2)
    assert T.full_size(g, add_id, T.ADD_BASE + T.PAIR * 1 + 0) == 2
    assert T.full_size(g, add_id, T.ADD_BASE + T.PAIR * 1 + 1) == 8
    bases = [0, T.FLAT_BASE, T.ADD_BASE, T.MASK_BASE, T.WINDOW_BASE, T.ACC_BASE, T.CAT_BASE,
             T.HELD_BASE, T.MASK2_BASE, T.GROUP_BASE + 1, T.TRANS_BASE]
    codes = [-1, 2**31 - 1] + [base + k for base in bases
                               for k in (0, 1, 2, 5, T.PAIR - 1, T.PAIR, T.PAIR + 1, 3 * T.PAIR + 7,
                                         T.trans_axis(T.PAIR + 2, 3, 1) - T.TRANS_BASE)]
    for op_id in (dot_id, red_id, add_id, 10**6):
        for axis in codes:
            n = T.full_size(g, op_id, axis)
            assert n is None or (isinstance(n, int) and n >= 0), (op_id, axis, n)

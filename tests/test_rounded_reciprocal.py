"""dlverify/rounded_reciprocal.py: `x / d` for a literal d, when the other program
multiplies by d's reciprocal rounded to the dtype (XLA's algebraic simplifier),
is computed as that multiplication, and the rounding is listed as an assumption.

Only the exact rounded reciprocal of a divisor of the other program is taken:
a wrong scale stays a multiplication that relates to nothing, exact reciprocals
(powers of two) are left to simplify.py, and a program dividing on both sides
keeps its divisions."""
import numpy as np

from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator
from dlverify.rounded_reciprocal import match_rounded_reciprocals

SQRT2 = np.float32(np.sqrt(2.0))
RECIP = np.float32(1) / SQRT2          # 0.70710677: not exactly 1 / SQRT2 over the reals


def _scaled(ids, kind, literal):
    """x (4, 4) `kind` a broadcast literal."""
    g = Graph(kind)
    b = GraphBuilder(g, ids)
    x = b.tensor((4, 4), "float32", "x")
    g.inputs = [x]
    c = b.op("broadcast_in_dim", [b.constant(np.float32(literal), (), "float32")], (4, 4), "float32",
             {"broadcast_dimensions": ()})
    g.outputs = [b.op(kind, [x, c], (4, 4), "float32")]
    return g


def _run(g, x):
    return Interpreter(g, 1).run([[x]])[g.outputs[0]][0]


def test_a_division_meets_the_multiplication_by_its_rounded_reciprocal():
    ids = IdAllocator()
    seq, dist = _scaled(ids, "div", SQRT2), _scaled(ids, "mul", RECIP)
    assumptions: list[str] = []
    assert match_rounded_reciprocals(seq, dist, ids, assumptions)
    assert [op.kind for op in seq.ops][-1] == "mul"
    x = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_array_equal(_run(seq, x), _run(dist, x))   # now the same arithmetic
    assert assumptions == ["x / 1.4142135 computed as x * 0.70710677, the reciprocal rounded to "
                           "float32, as XLA's algebraic simplifier does"]


def test_other_scales_exact_reciprocals_and_divisions_on_both_sides_stay():
    ids = IdAllocator()
    for seq, dist in ((_scaled(ids, "div", SQRT2), _scaled(ids, "mul", np.float32(0.7))),  # a wrong scale
                      (_scaled(ids, "div", 32.0), _scaled(ids, "mul", 0.03125)),          # exact: simplify's
                      (_scaled(ids, "div", SQRT2), _scaled(ids, "div", SQRT2))):
        assumptions: list[str] = []
        assert not match_rounded_reciprocals(seq, dist, ids, assumptions)
        assert [op.kind for op in seq.ops][-1] == "div" and assumptions == []


def _quotient_scaled(ids, d, b):
    """(x / d) * b, both broadcast literals: the sequential form of `b * x / d`."""
    g = Graph("quotient")
    gb = GraphBuilder(g, ids)
    x = gb.tensor((4, 4), "float32", "x")
    g.inputs = [x]

    def lit(v):
        return gb.op("broadcast_in_dim", [gb.constant(np.float32(v), (), "float32")], (4, 4),
                     "float32", {"broadcast_dimensions": ()})
    q = gb.op("div", [x, lit(d)], (4, 4), "float32")
    g.outputs = [gb.op("mul", [q, lit(b)], (4, 4), "float32")]
    return g


D, B = np.float32(0.271), np.float32(0.001)           # Adam's 1 - beta1^3, a learning rate
FOLDED = (np.float32(1) / D) * B                       # XLA: x * fl(fl(1/d) * b)


def test_a_quotient_then_scaled_meets_the_folded_multiplier():
    from dlverify.simplify import simplify_graph
    ids = IdAllocator()
    seq, dist = _quotient_scaled(ids, D, B), _scaled(ids, "mul", FOLDED)
    assumptions: list[str] = []
    assert match_rounded_reciprocals(seq, dist, ids, assumptions)
    assert assumptions == ["x / 0.271 computed as x * 3.690037, the reciprocal rounded to float32, "
                           "as XLA's algebraic simplifier does"]
    simplify_graph(seq, ids, assumptions)     # literal_product folds the two multipliers
    muls = [op for op in seq.ops if op.kind == "mul"]
    assert len(muls) == 1
    x = np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_array_equal(_run(seq, x), _run(dist, x))   # the same arithmetic as XLA's
    # over the reals the folded literal is not b / d: the rounding is stated, not hidden
    assert any("literal product 3.690037 * 0.001" in a for a in assumptions)


def test_a_quotient_scaled_by_another_literal_stays():
    ids = IdAllocator()
    wrong = (np.float32(1) / D) * np.float32(0.002)     # a learning rate twice as large
    seq, dist = _quotient_scaled(ids, D, B), _scaled(ids, "mul", wrong)
    assumptions: list[str] = []
    assert not match_rounded_reciprocals(seq, dist, ids, assumptions)
    assert [op.kind for op in seq.ops].count("div") == 1 and assumptions == []

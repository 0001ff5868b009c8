"""The op-kind table (dlverify/ops/table.py) is complete: every IR kind has an
arity, a family and algebraic class, numpy semantics and a fact exporter, and
the IR's kind sets are read from it."""
import numpy as np
import pytest

from dlverify import ir
from dlverify.ops import KINDS, Algebra, Family, NotExecutable, evaluate
from dlverify.ops import export as X

# Kinds the evaluator deliberately cannot run: a graph with one of them is not
# executable (witnesses say so) and the folder leaves its value unknown.
WITHOUT_SEMANTICS = {"scatter", "scatter_add", "custom_call"}


@pytest.mark.parametrize("name", sorted(ir.OPS))
def test_every_kind_has_every_entry(name):
    k = KINDS[name]
    assert k.name == name
    assert isinstance(k.family, Family) and isinstance(k.algebra, Algebra)
    assert k.arity.least >= 0 and (k.arity.most is None or k.arity.most >= k.arity.least)
    assert callable(k.export) and getattr(X, k.export.__name__) is k.export, \
        f"{name}: exporter is not one of dlverify/ops/export.py's"
    has_semantics = k.local is not None or k.collective is not None
    assert has_semantics == (name not in WITHOUT_SEMANTICS), \
        f"{name}: give it numpy semantics, or list it in WITHOUT_SEMANTICS with a reason"
    assert (k.collective is not None) == (k.family is Family.COLLECTIVE)


def test_the_ir_vocabulary_is_the_table():
    assert ir.OPS == frozenset(KINDS)
    sets = [ir.ELEMENTWISE_NONLINEAR_UNARY, ir.ELEMENTWISE_LINEAR_UNARY,
            ir.ELEMENTWISE_NONLINEAR_BINARY, ir.ELEMENTWISE_ADDSUB, ir.ELEMENTWISE_NARY,
            ir.REDUCTIONS, ir.COLLECTIVES, ir.LAYOUT, ir.OTHER]
    assert sum(len(s) for s in sets) == len(ir.OPS)          # disjoint
    assert frozenset().union(*sets) == ir.OPS                 # covering
    assert ir.ELEMENTWISE_LINEAR_UNARY == {"neg"}
    assert ir.ELEMENTWISE_ADDSUB == {"add", "sub"}
    assert {"and", "or", "xor", "shift_left", "rem"} <= ir.ELEMENTWISE_NONLINEAR_BINARY
    assert {"mul", "div", "dot_general", "constant", "axis_index"} <= ir.OTHER


@pytest.mark.parametrize("name", sorted(n for n, k in KINDS.items() if k.family is Family.ELEMENTWISE))
def test_every_elementwise_kind_evaluates(name):
    """Each elementwise entry runs on float or on integer operands of its arity."""
    k = KINDS[name]
    n = k.arity.least if name != "select_n" else 3
    params = {"y": 2} if name == "integer_pow" else {}
    for dtype, ins in [("float32", [np.array([0.25, 0.5, 0.75])] * n),
                       ("int32", [np.array([0, 1, 2], np.int32)] * n)]:
        try:
            out = evaluate(name, params, ins, (3,), "bool" if name in ("eq", "ne", "lt", "le", "gt",
                                                                       "ge", "is_finite",
                                                                       "convert_to_bool") else dtype)
        except NotExecutable:
            continue
        assert out.shape == (3,)
        return
    pytest.fail(f"{name} evaluates on neither float nor integer operands")


def test_arity_is_checked():
    with pytest.raises(NotExecutable):
        evaluate("add", {}, [np.zeros(2)], (2,), "float32")


@pytest.mark.parametrize("example", ["bitwise_offset.py", "megatron_mlp.py", "rotary_sp.py"])
def test_frontend_ops_have_their_arity(example):
    from conftest import EXAMPLES
    from dlverify.frontends.jaxpr import import_jax

    from dlverify.cases import load_cases

    for name, make in load_cases(EXAMPLES / example):
        c = make()
        p = import_jax(c.seq, c.dist, c.args, name)
        for g in (p.seq, p.dist):
            for op in g.ops:
                assert KINDS[op.kind].arity.accepts(len(op.inputs)), (name, op.kind, len(op.inputs))


def test_narrow_integer_types_are_not_numpy_aliases():
    """numpy reads "int4" as a 4-byte int; the IR's int4 (HLO s4) has 4 bits, so the
    evaluator has no exact type for it and a cast to it is never an identity."""
    from dlverify.ops.dtypes import convert_kind, exact_dtype

    assert exact_dtype("int4") is None and exact_dtype("uint2") is None
    assert exact_dtype("int32") == np.int32 and exact_dtype("bool") == np.bool_
    assert convert_kind("int32", "int4") == "convert_to_int"
    assert convert_kind("int8", "int32") is None and convert_kind("bool", "uint8") is None
    assert convert_kind("int32", "uint32") == "convert_to_int"
    assert convert_kind("float32", "bool") == "convert_to_bool"
    assert convert_kind("int32", "float32") is None

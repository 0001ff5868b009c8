"""A dot's size-1 dims given the roles the sequential dot gives them, that dot found by
the roles of the operand root's sized dims (dlverify/unit_roles.py), and a unit-layout
chain over a reshape that only moves size-1 dims written from that reshape's operand
(dlverify/unit_layouts.py, _UnitLayouts._units_only).

With one query head per rank and S_q = S_k, sizes alone cannot tell the key gradient
dS^T q (the query slot j contracted) from the query gradient dS k (j free); the sized
dims of the scores' gradient can: s_k free and s_q contracted is the key gradient.
Each rewrite is checked numerically with the shared evaluator, where it must not fire
too; the compiled GQA training step with one query head per rank (TP=8) verifies, and
its twin that forgets the transpose of dS in the key gradient is not verified and is
located at that transpose."""
from __future__ import annotations

import copy
import re

import numpy as np
from hlo_pairs import compiled_pair, example_module, verify_texts
from test_simplify import _dot, _graph

from dlverify.interpret import Interpreter
from dlverify.ir import Graph, IdAllocator
from dlverify.unit_layouts import unit_layouts_as_sequential
from dlverify.unit_roles import rooted, unit_roles_as_sequential

B, G, J, S, D = 2, 2, 4, 8, 4


def _same_values(before: Graph, after: Graph, in_shapes) -> None:
    ins = [[np.random.default_rng(i).standard_normal(s).astype(np.float32)]
           for i, s in enumerate(in_shapes)]
    outs = [Interpreter(h, 1).run(ins)[h.outputs[0]][0] for h in (before, after)]
    assert outs[0].shape == outs[1].shape
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def _halved(b, x, perm, shape):
    """x transposed by perm, then halved (the backward 1/sqrt(d) scaling)."""
    t = b.op("transpose", [x], shape, "float32", {"permutation": perm})
    c = b.constant(np.float32(2.0), (), "float32")
    two = b.op("broadcast_in_dim", [c], shape, "float32", {"broadcast_dimensions": ()})
    return b.op("div", [t, two], shape, "float32", {})


def _gradients(b, ds, q, k):
    """The program's key and query gradients: ds [b, g, j, s_q, s_k] (its root an exp),
    q [b, g, s, j, d], k [b, g, s, d]; dK = dS^T q contracts (s_q, j), dQ = dS k
    contracts s_k. Returns dK + (dQ summed over j and s_q)."""
    root = b.op("exp", [ds], (B, G, J, S, S), "float32", {})
    dst = _halved(b, root, (0, 1, 4, 3, 2), (B, G, S, S, J))
    dk = _dot(b, dst, q, (B, G, S, D), (3, 4), (2, 3), (0, 1), (0, 1))
    dsq = _halved(b, root, (0, 1, 3, 2, 4), (B, G, S, J, S))
    dq = _dot(b, dsq, k, (B, G, S, J, D), (4,), (2,), (0, 1), (0, 1))
    return b.op("add", [dk, b.op("reduce_sum", [dq], (B, G, S, D), "float32", {"axes": (3,)})],
                (B, G, S, D), "float32", {})


SEQ_SHAPES = [(B, G, J, S, S), (B, G, S, J, D), (B, G, S, D)]


def _seq() -> Graph:
    return _graph(_gradients, SEQ_SHAPES)[0]


def _rank_key_gradient(b, ds, q):
    """A rank's key gradient as the normal form leaves it: ds [b, 1, 1, s_q, s_k], its
    transpose [b, g, s_k, j, s_q] (j where no sequential transpose puts it), j left free
    against q [b, 1, s, d]."""
    root = b.op("exp", [ds], (B, 1, 1, S, S), "float32", {})
    dst = _halved(b, root, (0, 1, 4, 2, 3), (B, 1, S, 1, S))
    return _dot(b, dst, q, (B, 1, S, 1, D), (4,), (2,), (0, 1), (0, 1))


RANK_SHAPES = [(B, 1, 1, S, S), (B, 1, S, D)]


def _rewritten(build, shapes, seq=None):
    g, ids = _graph(build, shapes)
    before = copy.deepcopy(g)
    changed = unit_roles_as_sequential(seq or _seq(), g, ids)
    _same_values(before, g, shapes)
    return g, changed


def _dots(g: Graph):
    return [op for op in g.ops if op.kind == "dot_general"]


def _params(op):
    return {k: tuple(op.params[k]) for k in ("lhs_batch", "lhs_contract", "rhs_batch", "rhs_contract")}


def test_a_free_unit_is_contracted_as_the_key_gradient_contracts_it():
    g, changed = _rewritten(_rank_key_gradient, RANK_SHAPES)
    assert changed
    (dot,) = _dots(g)
    assert _params(dot) == {"lhs_batch": (0, 1), "lhs_contract": (3, 4),
                            "rhs_batch": (0, 1), "rhs_contract": (2, 3)}
    producer = g.producer()
    r = rooted(producer, lambda t: g.tensors[t].shape, dot.inputs[0])
    assert r is not None and r.perm == (0, 1, 4, 3, 2)       # the program's transpose
    assert [op.kind for op in r.chain] == ["div"]              # the scaling rebuilt on it
    assert g.tensors[dot.inputs[1]].shape == (B, 1, S, 1, D)   # q with its slot j
    assert not unit_roles_as_sequential(_seq(), g, IdAllocator())   # a fixpoint


def test_the_query_gradient_takes_the_sequential_permutation():
    # the rank's dQ reads dS [b, g, j, s_q, s_k] untransposed: the same roles as the
    # program's dQ, whose transpose puts j after s_q; the operand takes that transpose
    def rank_query_gradient(b, ds, k):
        root = b.op("exp", [ds], (B, 1, 1, S, S), "float32", {})
        c = b.constant(np.float32(2.0), (), "float32")
        two = b.op("broadcast_in_dim", [c], (B, 1, 1, S, S), "float32", {"broadcast_dimensions": ()})
        half = b.op("div", [root, two], (B, 1, 1, S, S), "float32", {})
        return _dot(b, half, k, (B, 1, 1, S, D), (4,), (2,), (0, 1), (0, 1))
    g, changed = _rewritten(rank_query_gradient, RANK_SHAPES)
    assert changed
    (dot,) = _dots(g)
    r = rooted(g.producer(), lambda t: g.tensors[t].shape, dot.inputs[0])
    assert r.perm == (0, 1, 3, 2, 4)
    assert _params(dot)["lhs_contract"] == (4,)


def test_the_rooted_operand_on_the_other_side():
    # the rank writes q first: dot(q, dS^T) with the root on the rhs; the program's dot
    # has it on the lhs, so the new dot takes the program's operand order
    def swapped(b, ds, q):
        root = b.op("exp", [ds], (B, 1, 1, S, S), "float32", {})
        dst = _halved(b, root, (0, 1, 4, 2, 3), (B, 1, S, 1, S))
        return _dot(b, q, dst, (B, 1, D, S, 1), (2,), (4,), (0, 1), (0, 1))
    g, changed = _rewritten(swapped, RANK_SHAPES)
    assert changed
    (dot,) = _dots(g)
    assert g.tensors[dot.inputs[1]].shape == (B, 1, S, 1, D)


def test_a_root_read_through_a_reshape_of_size_1_dims():
    # the key's weight gradient: x^T dK, dK [b, 1, s, d] (its root) reshaped to
    # [b, 1, s, 1, d] and transposed to [b, s, 1, 1, d]; the program reads dK's
    # transpose [b, s, g, d]
    def program(b, x, dk):
        root = b.op("exp", [dk], (B, G, S, D), "float32", {})
        t = b.op("transpose", [root], (B, S, G, D), "float32", {"permutation": (0, 2, 1, 3)})
        return _dot(b, x, t, (16, G, D), (1, 2), (0, 1))

    def rank(b, x, dk):
        root = b.op("exp", [dk], (B, 1, S, D), "float32", {})
        r = b.op("reshape", [root], (B, 1, S, 1, D), "float32", {})
        t = b.op("transpose", [r], (B, S, 1, 1, D), "float32", {"permutation": (0, 2, 1, 3, 4)})
        return _dot(b, x, t, (16, 1, 1, D), (1, 2), (0, 1))
    seq = _graph(program, [(16, B, S), (B, G, S, D)])[0]
    g, changed = _rewritten(rank, [(16, B, S), (B, 1, S, D)], seq)
    assert changed
    (dot,) = _dots(g)
    assert g.tensors[dot.inputs[1]].shape == (B, S, 1, D)
    assert g.tensors[dot.output].shape == (16, 1, D)


def test_no_rewrite_when_the_dot_is_the_sequential_form():
    def as_program(b, ds, q):
        root = b.op("exp", [ds], (B, 1, 1, S, S), "float32", {})
        dst = _halved(b, root, (0, 1, 4, 3, 2), (B, 1, S, S, 1))
        q5 = b.op("reshape", [q], (B, 1, S, 1, D), "float32", {})
        return _dot(b, dst, q5, (B, 1, S, D), (3, 4), (2, 3), (0, 1), (0, 1))
    _, changed = _rewritten(as_program, RANK_SHAPES)
    assert not changed


def test_no_rewrite_when_no_sequential_dot_has_the_sized_roles():
    # s_k contracted and s_q free against the key gradient's contraction of s_q: only
    # the query gradient could match (j free there too), and it does, so the rank's
    # query gradient is rewritten; with the program's dQ gone nothing fits
    def program_key_only(b, ds, q, k):
        root = b.op("exp", [ds], (B, G, J, S, S), "float32", {})
        dst = _halved(b, root, (0, 1, 4, 3, 2), (B, G, S, S, J))
        return _dot(b, dst, q, (B, G, S, D), (3, 4), (2, 3), (0, 1), (0, 1))
    seq = _graph(program_key_only, SEQ_SHAPES)[0]

    def rank_query_gradient(b, ds, k):
        root = b.op("exp", [ds], (B, 1, 1, S, S), "float32", {})
        return _dot(b, root, k, (B, 1, 1, S, D), (4,), (2,), (0, 1), (0, 1))
    _, changed = _rewritten(rank_query_gradient, RANK_SHAPES, seq)
    assert not changed


def test_no_rewrite_when_two_sequential_forms_fit():
    # the program holds the key gradient in two forms (q's dims in two orders): the
    # roles of the sized dims do not choose, so the dot stays as it is
    def two_forms(b, ds, q, k):
        out = _gradients(b, ds, q, k)
        root = b.op("exp", [ds], (B, G, J, S, S), "float32", {})
        dst = _halved(b, root, (0, 1, 4, 2, 3), (B, G, S, J, S))
        other = _dot(b, dst, q, (B, G, S, D), (4, 3), (2, 3), (0, 1), (0, 1))
        return b.op("add", [out, other], (B, G, S, D), "float32", {})
    seq = _graph(two_forms, SEQ_SHAPES)[0]
    _, changed = _rewritten(_rank_key_gradient, RANK_SHAPES, seq)
    assert not changed


def test_a_chain_over_a_reshape_of_size_1_dims_is_written_from_its_operand():
    # the rank's query gradient [b, 1, s, 1, d] reshaped to [b, 1, s, d], then moved and
    # flattened by the key gradient's pair (transpose (0, 2, 1, 3), reshape): written as
    # the query gradient's own pair from the dot's result, transpose (0, 2, 1, 3, 4) then
    # reshape, as the program writes it
    def program(b, x5, x4):
        r5 = b.op("exp", [x5], (B, G, S, J, D), "float32", {})
        t5 = b.op("transpose", [r5], (B, S, G, J, D), "float32", {"permutation": (0, 2, 1, 3, 4)})
        f5 = b.op("reshape", [t5], (B, S, G * J * D), "float32", {})
        r4 = b.op("exp", [x4], (B, G, S, D), "float32", {})
        t4 = b.op("transpose", [r4], (B, S, G, D), "float32", {"permutation": (0, 2, 1, 3)})
        f4 = b.op("reshape", [t4], (B, S, G * D), "float32", {})
        return b.op("concatenate", [f5, f4], (B, S, G * J * D + G * D), "float32", {"dimension": 2})

    def rank(b, x5):
        r5 = b.op("exp", [x5], (B, 1, S, 1, D), "float32", {})
        r4 = b.op("reshape", [r5], (B, 1, S, D), "float32", {})
        t4 = b.op("transpose", [r4], (B, S, 1, D), "float32", {"permutation": (0, 2, 1, 3)})
        return b.op("reshape", [t4], (B, S, D), "float32", {})
    seq = _graph(program, [(B, G, S, J, D), (B, G, S, D)])[0]
    g, ids = _graph(rank, [(B, 1, S, 1, D)])
    before = copy.deepcopy(g)
    assert unit_layouts_as_sequential(seq, g, ids)
    _same_values(before, g, [(B, 1, S, 1, D)])
    producer = g.producer()
    last = producer[g.outputs[0]]
    assert last.kind == "reshape"
    moved = producer[last.inputs[0]]
    assert moved.kind == "transpose" and tuple(moved.params["permutation"]) == (0, 2, 1, 3, 4)
    assert producer[moved.inputs[0]].kind == "exp"


# ------------------------------------------------------------------ compiled example

def _tp8_train():
    return example_module("gqa_replicated_kv").gqa_two_kv_heads_tp8_train()


def test_the_compiled_training_step_with_one_query_head_per_rank_verifies(tmp_path):
    seq, dist = compiled_pair(_tp8_train())
    res = verify_texts(tmp_path, seq, dist)
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert len(res.outputs) == 7


def _reading_dot_line(text: str, line: int) -> int:
    """The line of the dot that reads the result of the fusion whose computation holds
    `line` (XLA fuses the transpose of dS into one fusion and the key gradient's dot into
    the next)."""
    lines = text.splitlines()
    comp = next(re.match(r"%(\S+) ", lines[i]).group(1) for i in range(line - 1, -1, -1)
                if re.match(r"%\S+ \(", lines[i]))
    caller = next(re.search(r"%(\S+) = ", x).group(1) for x in lines if f"calls=%{comp}," in x)
    reader = next(re.search(r"calls=%([^,]+),", x).group(1) for x in lines
                  if "fusion(" in x and re.search(rf"%{re.escape(caller)}[,)]", x)
                  and f"%{caller} =" not in x)
    start = next(i for i, x in enumerate(lines) if x.startswith(f"%{reader} "))
    return next(i + 1 for i in range(start, len(lines)) if " dot(" in lines[i])


def test_the_key_gradient_without_the_transpose_of_ds_is_located(tmp_path):
    # the twin: the rank's fused key-gradient operand keeps dS as [b, g, s_q, s_k, j]
    # (no swap of s_q and s_k): dK = dS q instead of dS^T q; located at the swap or at
    # the key gradient's dot that reads it
    seq, dist = compiled_pair(_tp8_train())
    pattern = re.compile(r"(%transpose\.\d+ = f32\[2,1,8,8,1\]\{[\d,]+\} transpose\([^)]*\), "
                         r"dimensions=\{)0,1,4,3,2(\})")
    lines = [i for i, line in enumerate(dist.splitlines(), 1) if pattern.search(line)]
    assert len(lines) == 1, "the key gradient's transpose of dS is no longer in the compiled module"
    twin = pattern.sub(r"\g<1>0,1,3,4,2\g<2>", dist)
    res = verify_texts(tmp_path, seq, twin)
    assert not res.verified
    at = {lines[0], _reading_dot_line(twin, lines[0])}
    assert res.failures[0].line in at, [(f.op, f.line, f.message[:200]) for f in res.failures[:3]]

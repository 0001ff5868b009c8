"""One orientation per dot under a transpose interleaving its operands' free dims
(dlverify/simplify_layouts.py, transposed_dot). JAX computes grouped attention's
output as v^T p^T ([b, g, k, j, q]) where the program computes p v ([b, g, q, j, k]);
both transpose it to [b, q, k, g, j] for the output projection, an order no dot
computes (q and j are p's, k is v's). The transpose is split into the dot whose
operand order is the one the transpose reads first, its free dims in the
transpose's order, and the transpose left: both sides reach one form. A transpose
that interleaves the free dims only by a size-1 dim (XLA's one expert per rank,
which the program batches) stays, as before.

Each rewrite is checked on random data by the shared evaluator, and a rewrite with
its residual permutation inverted (a rule twin) is caught by that check; a
hand-written tensor-parallel HLO pair verifies (a false alarm before) and its twin,
contracting p's query dim instead of its key dim, does not.

On the distributed side a rank's block of a dim may have size 1 where the program's
is sized (one head per rank): the transpose then reads the other operand's sized
free dim first, or interleaves the free dims by that size-1 dim alone, and the sides
would split one value differently. There the form the sequential program's normal
form holds is taken (dlverify/dot_orientation.py): the distributed graph reaches
the sequential one's form (sizes aside), every form the choice can give is checked
by the shared evaluator whatever the partner holds, and a hand-written pair with one
head per rank verifies (a false alarm with the choice off) while its twin, the
rank's queries transposed wrongly, does not and is reported at that transpose."""
import copy
import itertools

import numpy as np
import pytest
from hlo_pairs import verify_texts
from test_simplify import _dot, _graph
from test_simplify_layouts import _agree, _form, _normal

from dlverify.dot_orientation import PartnerLayouts
from dlverify.interpret import Interpreter
from dlverify.ir import Graph
from dlverify.simplify import simplify_graph

# p [b, g, q, j, s] x v [b, g, s, k] -> [b, g, q, j, k]; v^T [b, g, k, s] x p^T
# [b, g, s, j, q] -> [b, g, k, j, q]
B, G, Q, J, S, K = 2, 3, 4, 2, 5, 6
_P, _V = (B, G, Q, J, S), (B, G, S, K)
_OUT = (B, Q, K, G, J)


def _pv(b, p, v):
    o = _dot(b, p, v, (B, G, Q, J, K), (4,), (2,), (0, 1), (0, 1))
    return b.op("transpose", [o], _OUT, "float32", {"permutation": (0, 2, 4, 1, 3)})


def _vt_pt(b, p, v):
    vt = b.op("transpose", [v], (B, G, K, S), "float32", {"permutation": (0, 1, 3, 2)})
    pt = b.op("transpose", [p], (B, G, S, J, Q), "float32", {"permutation": (0, 1, 4, 3, 2)})
    o = _dot(b, vt, pt, (B, G, K, J, Q), (3,), (2,), (0, 1), (0, 1))
    return b.op("transpose", [o], _OUT, "float32", {"permutation": (0, 4, 2, 1, 3)})


def test_attention_output_in_either_orientation_reaches_one_form():
    before, one = _normal(_pv, [_P, _V])
    before_other, other = _normal(_vt_pt, [_P, _V])
    _agree(before, one, [_P, _V])
    _agree(before_other, other, [_P, _V])
    assert _form(one) == _form(other)
    # the form: p v in the transpose's order of p's free dims (q, j), then a transpose
    out = next(op for op in other.ops if op.output == other.outputs[0])
    assert out.kind == "transpose"
    dot = next(op for op in other.ops if op.output == out.inputs[0])
    assert dot.kind == "dot_general" and other.tensors[dot.output].shape == (B, G, Q, J, K)


def test_a_split_with_its_residual_inverted_is_caught():
    # the rule twin: the dot' of the split, followed by the inverse of the residual
    # transpose the rule leaves (the residual here is not an involution), computes
    # another value; the shared evaluator tells it from the program's
    before, g = _normal(_vt_pt, [_P, _V])
    out = next(op for op in g.ops if op.output == g.outputs[0])
    residual = tuple(out.params["permutation"])
    inverse = tuple(residual.index(k) for k in range(len(residual)))
    assert inverse != residual
    twin = copy.deepcopy(g)
    bad = next(op for op in twin.ops if op.output == twin.outputs[0])
    bad.params = {"permutation": inverse}
    src = twin.tensors[bad.inputs[0]].shape
    twin.tensors[bad.output].shape = tuple(src[k] for k in inverse)
    rng = np.random.default_rng(3)
    ins = [[rng.standard_normal(s).astype(np.float32)] for s in (_P, _V)]
    a = Interpreter(before, 1).run(ins)[before.outputs[0]][0]
    b = Interpreter(twin, 1).run(ins)[twin.outputs[0]][0]
    assert a.shape != b.shape or not np.allclose(a, b, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("perm", list(itertools.permutations(range(5))))
def test_every_transpose_of_a_dot_and_of_its_swapped_dot_reach_one_form(perm):
    # [b, g, q, j, k] of p v, and the same value from v^T p^T, transposed by every
    # perm: one form each time (no size-1 dims), and the rewrite an identity
    out = tuple((B, G, Q, J, K)[j] for j in perm)
    swapped = (0, 1, 4, 2, 3)       # dot(v^T, p^T)'s dims as p v's: [b, g, k, q, j]

    def direct(b, p, v):
        o = _dot(b, p, v, (B, G, Q, J, K), (4,), (2,), (0, 1), (0, 1))
        return b.op("transpose", [o], out, "float32", {"permutation": perm})

    def other(b, p, v):
        o = _dot(b, v, p, (B, G, K, Q, J), (2,), (4,), (0, 1), (0, 1))
        return b.op("transpose", [o], out, "float32",
                    {"permutation": tuple(swapped.index(j) for j in perm)})
    before_one, one = _normal(direct, [_P, _V])
    before_two, two = _normal(other, [_P, _V])
    assert _form(one) == _form(two), perm
    _agree(before_one, one, [_P, _V])
    _agree(before_two, two, [_P, _V])


def test_a_transpose_interleaving_free_dims_by_a_size_1_dim_stays():
    # XLA's MoE dispatch with one expert per rank: [1, c, t] x [t, m, e] -> [1, c, m, e]
    # transposed to [m, 1, e, c]: the size-1 (a rank's share of the experts, which the
    # program batches) alone interleaves; splitting it here would order it where the
    # other side's batch dim does not go
    def build(b, x, w):
        d = _dot(b, x, w, (1, 8, 4, 3), (2,), (0,))
        return b.op("transpose", [d], (4, 1, 3, 8), "float32", {"permutation": (2, 0, 3, 1)})
    g, ids = _graph(build, [(1, 8, 5), (5, 4, 3)])
    before = copy.deepcopy(g)
    simplify_graph(g, ids)
    assert _form(before) == _form(g)


def test_a_size_1_dim_beside_interleaved_sized_free_dims_goes_with_its_operand():
    # the program's weight gradient of the output projection: its attention output
    # [b, g, q, j, 1, k] (v's head slice keeps a size-1 dim) transposed to
    # [g, j, 1, k, b, q]; the other side's dot computes it batched over (g, b): one form
    shape = (B, G, Q, J, 1, K)
    pv = (B, G, S, 1, K)

    def direct(b, p, v):
        o = _dot(b, p, v, shape, (4,), (2,), (0, 1), (0, 1))
        return b.op("transpose", [o], (G, J, 1, K, B, Q), "float32",
                    {"permutation": (1, 3, 4, 5, 0, 2)})

    def batched_gb(b, p, v):
        pg = b.op("transpose", [p], (G, B, J, Q, S), "float32", {"permutation": (1, 0, 3, 2, 4)})
        vg = b.op("transpose", [v], (G, B, S, 1, K), "float32", {"permutation": (1, 0, 2, 3, 4)})
        o = _dot(b, pg, vg, (G, B, J, Q, 1, K), (4,), (2,), (0, 1), (0, 1))
        return b.op("transpose", [o], (G, J, 1, K, B, Q), "float32",
                    {"permutation": (0, 2, 4, 5, 1, 3)})
    before, one = _normal(direct, [_P, pv])
    before_two, two = _normal(batched_gb, [_P, pv])
    _agree(before, one, [_P, pv])
    _agree(before_two, two, [_P, pv])
    assert _form(one) == _form(two)


# ------------------------------------------------------------------ an HLO pair
_SEQ = """HloModule seq

ENTRY %main (p: f32[2,4,3,2,3], v: f32[2,4,3,6], wo: f32[6,4,2,7]) -> f32[2,3,7] {
  %p = f32[2,4,3,2,3]{4,3,2,1,0} parameter(0)
  %v = f32[2,4,3,6]{3,2,1,0} parameter(1)
  %wo = f32[6,4,2,7]{3,2,1,0} parameter(2)
  %o = f32[2,4,3,2,6]{4,3,2,1,0} dot(f32[2,4,3,2,3]{4,3,2,1,0} %p, f32[2,4,3,6]{3,2,1,0} %v), lhs_batch_dims={0,1}, lhs_contracting_dims={4}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
  %ot = f32[2,3,6,4,2]{4,3,2,1,0} transpose(f32[2,4,3,2,6]{4,3,2,1,0} %o), dimensions={0,2,4,1,3}
  ROOT %y = f32[2,3,7]{2,1,0} dot(f32[2,3,6,4,2]{4,3,2,1,0} %ot, f32[6,4,2,7]{3,2,1,0} %wo), lhs_contracting_dims={2,3,4}, rhs_contracting_dims={0,1,2}
}
"""

# the KV groups g split over 2 ranks (p, v along g, wo's g rows); XLA's v^T p^T, then
# the output projection's partial sums reduced. PT: how the rank transposes p
_DIST = """HloModule dist, num_partitions=2

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

ENTRY %main (p: f32[2,2,3,2,3], v: f32[2,2,3,6], wo: f32[6,2,2,7]) -> f32[2,3,7] {
  %p = f32[2,2,3,2,3]{4,3,2,1,0} parameter(0), sharding={devices=[1,2,1,1,1]0,1}
  %v = f32[2,2,3,6]{3,2,1,0} parameter(1), sharding={devices=[1,2,1,1]0,1}
  %wo = f32[6,2,2,7]{3,2,1,0} parameter(2), sharding={devices=[1,2,1,1]0,1}
  %vt = f32[2,2,6,3]{3,2,1,0} transpose(f32[2,2,3,6]{3,2,1,0} %v), dimensions={0,1,3,2}
  %pt = f32[2,2,3,2,3]{4,3,2,1,0} transpose(f32[2,2,3,2,3]{4,3,2,1,0} %p), dimensions=PT
  %o = f32[2,2,6,2,3]{4,3,2,1,0} dot(f32[2,2,6,3]{3,2,1,0} %vt, f32[2,2,3,2,3]{4,3,2,1,0} %pt), lhs_batch_dims={0,1}, lhs_contracting_dims={3}, rhs_batch_dims={0,1}, rhs_contracting_dims={2}
  %ot = f32[2,3,6,2,2]{4,3,2,1,0} transpose(f32[2,2,6,2,3]{4,3,2,1,0} %o), dimensions={0,4,2,1,3}
  %part = f32[2,3,7]{2,1,0} dot(f32[2,3,6,2,2]{4,3,2,1,0} %ot, f32[6,2,2,7]{3,2,1,0} %wo), lhs_contracting_dims={2,3,4}, rhs_contracting_dims={0,1,2}
  ROOT %y = f32[2,3,7]{2,1,0} all-reduce(f32[2,3,7]{2,1,0} %part), replica_groups={{0,1}}, use_global_device_ids=true, channel_id=1, to_apply=%sum
}
"""


def test_compiled_attention_output_in_xlas_orientation_verifies(tmp_path):
    from hlo_pairs import assert_pair_verifies
    # p^T: [b, g, q, j, s] -> [b, g, s, j, q]
    assert_pair_verifies(tmp_path, _SEQ, _DIST.replace("PT", "{0,1,4,3,2}"),
                         ["out0 = r0.out0  (replicated on all 2 ranks)"])


def test_its_twin_contracting_the_query_dim_is_not_verified(tmp_path):
    # the twin takes p as it is for p^T (q = s = 3): it contracts the queries, not the keys
    res = verify_texts(tmp_path, _SEQ, _DIST.replace("PT", "{0,1,2,3,4}"))
    assert not res.verified
    assert res.failures


# ------------------------------------------------- the sequential program's orientation
# q = x @ wq, [b, s, d] x [d, h, e] -> [b, s, h, e], transposed to [h, b, e, s] (a weight
# gradient's layout). The program's h is sized: the transpose reads wq's free dim first,
# so its normal form is wq^T x^T [h, e, b, s], then (0, 2, 1, 3). A rank holding one
# head has h = 1: the transpose reads x's b first, and by the sized dims alone it would
# keep x @ wq and the whole transpose.
_B, _S, _D, _H, _E = 2, 3, 4, 2, 5


def _q_transposed(heads: int, perm=(2, 0, 3, 1)):
    def build(b, x, w):
        q = _dot(b, x, w, (_B, _S, heads, _E), (2,), (0,))
        shape = tuple((_B, _S, heads, _E)[j] for j in perm)
        return b.op("transpose", [q], shape, "float32", {"permutation": perm})
    return build, [(_B, _S, _D), (_D, heads, _E)]


def _structure(g: Graph) -> list[str]:
    """The outputs' expressions without shapes: the ops, their params and operands."""
    producer = {op.output: op for op in g.ops}

    def expr(t: int) -> str:
        op = producer.get(t)
        if op is None:
            return f"in{g.inputs.index(t)}"
        params = sorted((k, str(v)) for k, v in op.params.items())
        return f"{op.kind}{params}({', '.join(expr(i) for i in op.inputs)})"
    return [expr(t) for t in g.outputs]


def _with_partner(build, shapes, seq: Graph | None):
    """(before, the normal form) of build's graph, simplified as the distributed graph
    against the sequential normal form `seq` (None: as the sequential graph)."""
    g, ids = _graph(build, shapes)
    before = copy.deepcopy(g)
    simplify_graph(g, ids, partner=seq)
    return before, g


def _out(g: Graph):
    return next(op for op in g.ops if op.output == g.outputs[0])


def _seq_normal(build, shapes) -> Graph:
    return _normal(build, shapes)[1]


def test_a_rank_with_one_head_takes_the_programs_orientation():
    seq = _seq_normal(*_q_transposed(_H))
    build, shapes = _q_transposed(1)
    alone_before, alone = _with_partner(build, shapes, None)
    before, dist = _with_partner(build, shapes, seq)
    _agree(alone_before, alone, shapes)
    _agree(before, dist, shapes)
    # by the sized dims alone the transpose stays whole over x @ wq ...
    assert _structure(alone) == _structure(alone_before)
    # ... and against the program it is the program's wq^T x^T, then (0, 2, 1, 3)
    assert _structure(dist) == _structure(seq)
    out = next(op for op in dist.ops if op.output == dist.outputs[0])
    assert out.kind == "transpose" and out.params["permutation"] == (0, 2, 1, 3)


def test_a_transpose_interleaving_free_dims_by_a_rank_s_head_of_one_splits_as_the_program():
    # XLA's d(attn)^T = wo dy^T, [h, e, b, s], transposed to [b, h, s, e]: with h = 1
    # the free dims interleave by that size-1 dim alone (it stays by default); the
    # program, h sized, splits it into dy wo^T, [b, s, h, e], then (0, 2, 1, 3)
    def attn_grad(heads):
        def build(b, w, dy):
            g = _dot(b, w, dy, (heads, _E, _B, _S), (2,), (2,))
            return b.op("transpose", [g], (_B, heads, _S, _E), "float32",
                        {"permutation": (2, 0, 3, 1)})
        return build, [(heads, _E, _D), (_B, _S, _D)]
    seq = _seq_normal(*attn_grad(_H))
    build, shapes = attn_grad(1)
    alone_before, alone = _with_partner(build, shapes, None)
    before, dist = _with_partner(build, shapes, seq)
    _agree(alone_before, alone, shapes)
    _agree(before, dist, shapes)
    # alone it stays: the whole transpose over the rank's dot (its operands in
    # dot_layout's order); against the program, the program's form
    assert _out(alone).kind == "transpose" and _out(alone).params["permutation"] == (2, 0, 3, 1)
    assert _structure(dist) == _structure(seq)
    assert _out(dist).params["permutation"] == (0, 2, 1, 3)


@pytest.mark.parametrize("perm", list(itertools.permutations(range(4))))
def test_every_form_the_partner_can_choose_is_the_same_function(perm):
    # the rank's dot with a head of one, transposed by every perm, against a partner
    # holding the program's forms of the same perm (sized heads) and against one holding
    # the swapped dot's: whatever it chooses, the shared evaluator finds the outputs equal
    build, shapes = _q_transposed(1, perm)
    partners = [_seq_normal(*_q_transposed(_H, perm)), _seq_normal(*_q_transposed(_H, (2, 3, 0, 1)))]
    for seq in partners:
        before, dist = _with_partner(build, shapes, seq)
        _agree(before, dist, shapes)


def test_the_partner_s_forms_are_read_role_by_role():
    seq = _seq_normal(*_q_transposed(_H))
    layouts = PartnerLayouts(seq)
    # wq^T x^T [h, e, b, s] then (0, 2, 1, 3); the rank's block of it (h = 1) is held,
    # not the rank's x @ wq transposed whole, nor a block with e and s swapped
    held = ((), (_H, _E), (_B, _S), (_D,))
    assert any(f.sizes == held and f.perm == (0, 2, 1, 3) for f in layouts.transposed)
    from dlverify.dot_orientation import Form
    assert layouts.holds(Form(((), (1, _E), (_B, _S), (_D,)), 4, (0, 2, 1, 3)))
    assert not layouts.holds(Form(((), (_B, _S), (1, _E), (_D,)), 4, (2, 0, 3, 1)))
    assert not layouts.holds(Form(((), (1, _E), (_B, _S), (_D,)), 4, (0, 3, 1, 2)))


# ------------------------------------------------------ an HLO pair, one head per rank
_SEQ_Q = """HloModule seq

ENTRY %main (x: f32[3,3,4], wq: f32[4,2,3]) -> f32[2,3,3,3] {
  %x = f32[3,3,4]{2,1,0} parameter(0)
  %wq = f32[4,2,3]{2,1,0} parameter(1)
  %q = f32[3,3,2,3]{3,2,1,0} dot(f32[3,3,4]{2,1,0} %x, f32[4,2,3]{2,1,0} %wq), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  ROOT %qt = f32[2,3,3,3]{3,2,1,0} transpose(f32[3,3,2,3]{3,2,1,0} %q), dimensions={2,0,3,1}
}
"""

# the heads split over 2 ranks (wq's h), one each; the rank's q [b, s, 1, e] transposed
# to [1, b, e, s] (PERM; b = s = e = 3), the heads gathered
_DIST_Q = """HloModule dist, num_partitions=2

ENTRY %main (x: f32[3,3,4], wq: f32[4,1,3]) -> f32[2,3,3,3] {
  %x = f32[3,3,4]{2,1,0} parameter(0), sharding={replicated}
  %wq = f32[4,1,3]{2,1,0} parameter(1), sharding={devices=[1,2,1]0,1}
  %q = f32[3,3,1,3]{3,2,1,0} dot(f32[3,3,4]{2,1,0} %x, f32[4,1,3]{2,1,0} %wq), lhs_contracting_dims={2}, rhs_contracting_dims={0}
  %qt = f32[1,3,3,3]{3,2,1,0} transpose(f32[3,3,1,3]{3,2,1,0} %q), dimensions=PERM
  ROOT %y = f32[2,3,3,3]{3,2,1,0} all-gather(f32[1,3,3,3]{3,2,1,0} %qt), channel_id=1, replica_groups={{0,1}}, dimensions={0}, use_global_device_ids=true
}
"""


def test_compiled_queries_transposed_with_one_head_per_rank_verify(tmp_path):
    from hlo_pairs import assert_pair_verifies
    assert_pair_verifies(tmp_path, _SEQ_Q, _DIST_Q.replace("PERM", "{2,0,3,1}"),
                         ["out0 = r0.out0  (replicated on all 2 ranks)"])


def test_they_are_a_false_alarm_without_the_program_s_orientation(tmp_path, monkeypatch):
    # the choice off (no form held): the rank keeps x @ wq under the whole transpose,
    # the program wq^T x^T: no relation
    monkeypatch.setattr(PartnerLayouts, "holds", lambda self, form: False)
    assert not verify_texts(tmp_path, _SEQ_Q, _DIST_Q.replace("PERM", "{2,0,3,1}")).verified


def test_their_twin_transposing_the_queries_wrongly_is_not_verified_and_located(tmp_path):
    # [1, s, e, b] for [1, b, e, s]: each rank's block transposed in (b, s)
    res = verify_texts(tmp_path, _SEQ_Q, _DIST_Q.replace("PERM", "{2,1,3,0}"))
    assert not res.verified
    line = next(i for i, text in enumerate(_DIST_Q.splitlines(), 1) if "%qt = " in text)
    assert res.failures[0].line == line, [(f.op, f.line, f.message[:120]) for f in res.failures]

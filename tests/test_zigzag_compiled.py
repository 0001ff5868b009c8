"""Zigzag (load-balanced) ring attention as XLA compiles it (bench/xla_examples.py).

XLA partitions the un-permute after `shard_map` (a take of the zigzag-ordered output
along the sharded dim): each rank places its rows where the inverse permutation sends
them, zeros elsewhere, and an all_reduce sums the placements; the rows are read in
chunks, a reshape that splits them right after the online softmax's last merge.
dlverify/reorders.py reads that un-permute (evaluated on every rank; an all_reduce is
movement only where each element has one nonzero term) and computes it as the gather
of an all_gather; dlverify/shift_algebra.py pushes the merges' factors below no
reshape the rewrite cannot follow, so the one that splits the rows reads a value
already shift-free.

Soundness: the canonical form computes, by the shared evaluator, what the placements
compute on every rank; a placement where two ranks write one element, or a table
that is not the inverse, is not read; the online-softmax rewrite keeps every output;
every derived view is checked on a run of both programs; the compiled twins stay not
verified and located at their `# BUG` line.
"""
# XLA_FLAGS (8 host devices): tests/conftest.py
from __future__ import annotations

import copy

import numpy as np
import pytest
from conftest import bug_line
from hlo_pairs import assert_compiled_case_and_twin, assert_pair_verifies, compiled_pair, example_module, \
    verify_texts
from test_ring_attention import ARGS, _heads, _outputs_unchanged_by_the_rewrite, _reference, _two_blocks, \
    _views_hold

from dlverify.api import verify_jax
from dlverify.frontends.jax_compiled import dumped_after_optimizations
from dlverify.frontends.jaxpr import import_jax
from dlverify.hlo_api import hlo_problem
from dlverify.interpret import Interpreter
from dlverify.ir import IdAllocator
from dlverify.numeric import run_both, value_error
from dlverify.reorders import canonical, gathered_output_chain, inverse
from dlverify.pass_order import rewrite

SEQ = """HloModule seq

ENTRY %main (x: f32[8,2]) -> f32[8,2] {
  %x = f32[8,2]{1,0} parameter(0)
  ROOT %y = f32[8,2]{1,0} exponential(%x)
}
"""

# CP=2, four chunks of two rows: rank r picks chunks ORDER[2r], ORDER[2r+1] of the
# replicated input (XLA's form of the take before shard_map), and puts its rows back
# as XLA partitions the take after it: chunk i of the output is zigzag chunk BACK[i],
# placed by the rank that holds it (BACK[i] - 2r in [0, 2)), zeros elsewhere, summed.
DIST = """HloModule dist, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (x: f32[8,2]) -> f32[8,2] {
  %x = f32[8,2]{1,0} parameter(0), sharding={replicated}
  %pid = u32[] partition-id()
  %r = s32[] convert(%pid)
  %two = s32[] constant(2)
  %start = s32[] multiply(%r, %two)
  %order = s32[4]{0} constant({0, 3, 1, 2})
  %mine = s32[2]{0} dynamic-slice(%order, %start), dynamic_slice_sizes={2}
  %idx = s32[2,1]{1,0} reshape(%mine)
  %chunks = f32[4,2,2]{2,1,0} reshape(%x)
  %g = f32[2,1,2,2]{3,2,1,0} gather(%chunks, %idx), offset_dims={1,2,3}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,2,2}
  %local = f32[4,2]{1,0} reshape(%g)
  %y = f32[4,2]{1,0} exponential(%local)
  %yc = f32[2,2,2]{2,1,0} reshape(%y)
  %back = s32[4]{0} constant({0, 2, 3, 1})
  %sb = s32[4]{0} broadcast(%start), dimensions={}
  %lo = pred[4]{0} compare(%back, %sb), direction=LT
  %one = s32[] constant(1)
  %end = s32[] add(%start, %one)
  %eb = s32[4]{0} broadcast(%end), dimensions={}
  %hi = pred[4]{0} compare(%back, %eb), direction=GT
  %away = pred[4]{0} or(%lo, %hi)
  %mask = pred[4,2,2]{2,1,0} broadcast(%away), dimensions={0}
  %rel = s32[4]{0} subtract(%back, %sb)
  %ridx = s32[4,1]{1,0} reshape(%rel)
  %picked = f32[4,1,2,2]{3,2,1,0} gather(%yc, %ridx), offset_dims={1,2,3}, collapsed_slice_dims={}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,2,2}
  %p = f32[4,2,2]{2,1,0} reshape(%picked)
  %zero = f32[] constant(0)
  %zeros = f32[4,2,2]{2,1,0} broadcast(%zero), dimensions={}
  %placed = f32[4,2,2]{2,1,0} select(%mask, %zeros, %p)
  %sum = f32[4,2,2]{2,1,0} all-reduce(%placed), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=%add
  ROOT %o = f32[8,2]{1,0} reshape(%sum)
}
"""

TWINS = {
    # the zigzag order again instead of its inverse
    "not_inverse": ("constant({0, 2, 3, 1})", "constant({0, 3, 1, 2})"),
    # every rank places every chunk it gathers (indices clamped): rows summed twice
    "unmasked": ("select(%mask, %zeros, %p)", "select(%mask, %p, %p)"),
    # a mask one chunk too narrow: the rank's second chunk dropped
    "mask_off_by_one": ("direction=GT", "direction=GE"),
    # the sum over the wrong group (each rank alone): a rank's own chunks only
    "groups_split": ("replica_groups={{0,1}}", "replica_groups={{0},{1}}"),
}


def _problem(tmp_path, dist: str):
    (tmp_path / "seq.hlo").write_text(SEQ)
    (tmp_path / "dist.hlo").write_text(dist)
    return hlo_problem(tmp_path / "seq.hlo", tmp_path / "dist.hlo", None, None, IdAllocator())


def test_the_partitioned_unpermute_verifies(tmp_path):
    res = assert_pair_verifies(tmp_path, SEQ, DIST, ["out0 = r0.out0  (replicated on all 2 ranks)"])
    assert any("put back in the natural order" in n for n in res.notes)


def test_the_unpermute_is_read_as_the_inverse_and_its_gather_computes_the_same(tmp_path):
    """The chain read is the inverse of the pick, and the canonical form (gather of an
    all_gather) computes, by the shared evaluator, what the placements compute on
    every rank."""
    problem = _problem(tmp_path, DIST)
    g = problem.dist
    chain = gathered_output_chain(problem, g.outputs[0])
    assert chain is not None and chain.dim == 0
    assert chain.perm == inverse((0, 1, 6, 7, 2, 3, 4, 5))      # rows of chunks 0, 3, 1, 2
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 2)).astype(np.float32)
    coords = lambda r, a: problem.mesh.coords(r)[a]   # noqa: E731
    before = Interpreter(g, 2, coords).run([[x, x]])[g.outputs[0]]
    canonical(g, chain, problem.ids)
    after = Interpreter(g, 2, coords).run([[x, x]])[g.outputs[0]]
    for r in range(2):
        np.testing.assert_array_equal(before[r], after[r])
        np.testing.assert_allclose(after[r], np.exp(x), rtol=1e-6)


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_a_wrong_unpermute_is_not_verified(tmp_path, twin):
    old, new = TWINS[twin]
    assert old in DIST
    dist = DIST.replace(old, new)
    res = verify_texts(tmp_path, SEQ, dist)
    assert not res.verified
    if twin != "not_inverse":   # (a permutation, read, but not the inverse of the pick)
        problem = _problem(tmp_path, dist)
        assert gathered_output_chain(problem, problem.dist.outputs[0]) is None


# ------------------------------------------------ the merges' factors above a row split

def _split_rows(f):
    """f's [heads, T, dh] result with its query rows split in two chunks."""
    return lambda *a: f(*a).reshape(a[0].shape[0], 2, a[0].shape[1] // 2, a[0].shape[2])


def test_the_merges_before_a_reshape_that_splits_the_rows_verify():
    """The online softmax's last merge read in chunks (XLA's un-permute reads the rows
    as [chunks, chunk, d]): the reshape is outside the shift algebra, so the value it
    reads is rewritten shift-free, every output kept."""
    seq, dist = _split_rows(_reference), _heads(_split_rows(_two_blocks(True)))
    _outputs_unchanged_by_the_rewrite(import_jax(seq, dist, ARGS))
    res = verify_jax(seq, dist, *ARGS, engine="clingo")
    assert res.verified, [(f.op, f.line, f.message) for f in res.failures[:2]]
    _views_hold(res)


def test_a_missing_rescale_before_a_row_split_is_not_verified():
    seq, dist = _split_rows(_reference), _heads(_split_rows(_two_blocks(False)))
    _outputs_unchanged_by_the_rewrite(import_jax(seq, dist, ARGS))
    assert not verify_jax(seq, dist, *ARGS, engine="clingo").verified


# ------------------------------------------------ the compiled examples

def test_compiled_zigzag_causal_verifies_and_its_unpermute_twin_is_located(tmp_path):
    mod = example_module("ring_attention_zigzag")
    assert_compiled_case_and_twin(tmp_path, mod.ring_zigzag_causal(),
                                  mod.ring_zigzag_bug_unpermute_not_inverse(), dumped=True)


@pytest.mark.parametrize("name", ["ring_zigzag_fori_loop", "ring_zigzag_per_rank_pick",
                                  "ring_zigzag_grads", "ring_zigzag_rotary", "ring_zigzag_train"])
def test_compiled_zigzag_case_verifies(tmp_path, name):
    case = getattr(example_module("ring_attention_zigzag"), name)()
    res = verify_texts(tmp_path, *compiled_pair(case, dumped=True))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]


# ------------------------------------------------ transposes through ring passes (simplify_layouts.py)

PASSED = {
    # the rotated halves of k concatenated, passed on twice, transposed for q k^T
    "concatenate": """HloModule t, num_partitions=2

ENTRY %main (a: f32[4,2], b: f32[4,2]) -> f32[4,4] {
  %a = f32[4,2]{1,0} parameter(0)
  %b = f32[4,2]{1,0} parameter(1)
  %c = f32[4,4]{1,0} concatenate(%a, %b), dimensions={1}
  %p = f32[4,4]{1,0} collective-permute(%c), channel_id=1, source_target_pairs={{0,1}}
  %p2 = f32[4,4]{1,0} collective-permute(%p), channel_id=2, source_target_pairs={{1,0},{0,1}}
  ROOT %t = f32[4,4]{0,1} transpose(%p2), dimensions={1,0}
}
""",
    # k = x w passed on, transposed for q k^T
    "dot": """HloModule t, num_partitions=2

ENTRY %main (x: f32[4,3], w: f32[3,5]) -> f32[5,4] {
  %x = f32[4,3]{1,0} parameter(0)
  %w = f32[3,5]{1,0} parameter(1)
  %k = f32[4,5]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %p = f32[4,5]{1,0} collective-permute(%k), channel_id=1, source_target_pairs={{0,1}}
  ROOT %t = f32[5,4]{0,1} transpose(%p), dimensions={1,0}
}
""",
}


@pytest.mark.parametrize("name", sorted(PASSED))
def test_a_transpose_goes_through_ring_passes_into_what_computes_it(name):
    """transpose(cp(x)) is cp(transpose(x)) (a permute sends a rank's whole value; a
    rank receiving nothing holds zeros, which a transpose keeps), taken only into a
    concatenation or a dot that computes it whole: by the shared evaluator on both
    ranks (rank 0 receives nothing in the first pass), and no transpose is left."""
    from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module
    from dlverify.simplify import simplify_graph
    ids = IdAllocator()
    g, _ = hlo_to_graph(parse_hlo_module(PASSED[name], "t.hlo"), ids, "g")
    rng = np.random.default_rng(1)
    ins = [[rng.standard_normal(g.tensors[t].shape).astype(np.float32) for _ in range(2)]
           for t in g.inputs]
    before = Interpreter(g, 2).run(ins)[g.outputs[0]]
    assert simplify_graph(g, ids)
    assert all(op.inputs[0] in g.inputs for op in g.ops if op.kind == "transpose")   # (the pieces')
    assert g.producer()[g.outputs[0]].kind == "collective_permute"
    after = Interpreter(g, 2).run(ins)[g.outputs[0]]
    for r in range(2):
        np.testing.assert_allclose(after[r], before[r], rtol=1e-6, atol=1e-6)


# ------------------------------------------------ sharded inputs reordered across ranks

# CP=2, four chunks of two rows; rank r holds rows 4r..4r+3 (chunks 2r, 2r+1) and
# computes on the zigzag chunks (r, 3-r): each rank keeps one chunk and swaps the other
# with its partner by a collective_permute (XLA's partitioned take along the sharded
# dim), then puts its rows back the same way. The sequential exp is elementwise, so the
# pair verifies either way: what is tested is that both reorders are read.
SHARDED_SEQ = SEQ
SHARDED_DIST = """HloModule dist, num_partitions=2

ENTRY %main (x: f32[4,2]) -> f32[4,2] {
  %x = f32[4,2]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}
  %pid = u32[] partition-id()
  %zero = u32[] constant(0)
  %first = pred[] compare(%pid, %zero), direction=EQ
  %m = pred[2,2]{1,0} broadcast(%first), dimensions={}
  %lo = f32[2,2]{1,0} slice(%x), slice={[0:2], [0:2]}
  %hi = f32[2,2]{1,0} slice(%x), slice={[2:4], [0:2]}
  %got = f32[2,2]{1,0} collective-permute(%hi), channel_id=1, source_target_pairs={{0,1},{1,0}}
  %a = f32[2,2]{1,0} select(%m, %lo, %got)
  %b = f32[2,2]{1,0} select(%m, %got, %lo)
  %local = f32[4,2]{1,0} concatenate(%a, %b), dimensions={0}
  %y = f32[4,2]{1,0} exponential(%local)
  %ylo = f32[2,2]{1,0} slice(%y), slice={[0:2], [0:2]}
  %yhi = f32[2,2]{1,0} slice(%y), slice={[2:4], [0:2]}
  %keep = f32[2,2]{1,0} select(%m, %ylo, %yhi)
  %send = f32[2,2]{1,0} select(%m, %yhi, %ylo)
  %back = f32[2,2]{1,0} collective-permute(%send), channel_id=2, source_target_pairs={{0,1},{1,0}}
  ROOT %o = f32[4,2]{1,0} concatenate(%keep, %back), dimensions={0}
}
"""

SHARDED_TWINS = {
    # the rows put back in the other order on each rank
    "unpermute_swapped": ("concatenate(%keep, %back)", "concatenate(%back, %keep)"),
    # only rank 0 sends: rank 0 computes on zeros in place of its partner's chunk
    "one_way": ("channel_id=1, source_target_pairs={{0,1},{1,0}}", "channel_id=1, source_target_pairs={{0,1}}"),
}


def test_a_sharded_input_reordered_across_ranks_is_read_and_its_canonical_form_computes_it(tmp_path):
    """The chain read from the sharded input (the zigzag order 0, 3, 1, 2 of the
    chunks, each rank its block) and from the un-permute (the inverse, each rank its
    block of the natural order); the canonical forms (all_gather, gather, dynamic_slice)
    compute, by the shared evaluator, what the collective_permutes compute on both ranks."""
    from dlverify.reorders import input_chains
    problem = _problem(tmp_path, SHARDED_DIST)
    g = problem.dist
    chains = input_chains(problem)
    assert list(chains) == [problem.seq.inputs[0]]
    ch = chains[problem.seq.inputs[0]]
    zigzag = (0, 1, 6, 7, 2, 3, 4, 5)
    assert (ch.dim, ch.perm, ch.block) == (0, zigzag, (problem.mesh.axis_names[0], 4))
    back = gathered_output_chain(problem, g.outputs[0], (0, inverse(zigzag)))
    assert back is not None and back.block == ch.block
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 2)).astype(np.float32)
    coords = lambda r, a: problem.mesh.coords(r)[a]   # noqa: E731
    blocks = [[x[:4], x[4:]]]
    before = Interpreter(g, 2, coords).run(blocks)
    canonical(g, ch, problem.ids)
    canonical(g, back, problem.ids)
    after = Interpreter(g, 2, coords).run(blocks)
    for r in range(2):
        np.testing.assert_array_equal(after[ch.out][r], before[ch.out][r])
        np.testing.assert_array_equal(after[g.outputs[0]][r], before[g.outputs[0]][r])
        np.testing.assert_allclose(after[g.outputs[0]][r], np.exp(x[4 * r:4 * r + 4]), rtol=1e-6)


def test_the_sharded_reorder_pair_verifies_in_the_reordered_program(tmp_path):
    res = assert_pair_verifies(tmp_path, SHARDED_SEQ, SHARDED_DIST, ["out0 = concat(r0.out0, r1.out0; dim 0)"])
    assert any("put back in the natural order" in n for n in res.notes)


@pytest.mark.parametrize("twin", sorted(SHARDED_TWINS))
def test_a_wrong_sharded_reorder_is_not_verified(tmp_path, twin):
    old, new = SHARDED_TWINS[twin]
    assert old in SHARDED_DIST
    assert not verify_texts(tmp_path, SHARDED_SEQ, SHARDED_DIST.replace(old, new)).verified


def _sliced(mod, order_in, order_out):
    import jax
    import dlverify
    def dist(q, k, v):
        q, k, v = (mod.reorder_by_slices(x, order_in) for x in (q, k, v))
        return mod.reorder_by_slices(mod._sharded(mod.ring_zigzag)(q, k, v), order_out)
    return dlverify.Case(seq=mod.causal_seq, dist=jax.jit(dist), args=mod._args(), expect="bug")


def test_compiled_zigzag_reordered_by_slices_verifies_and_its_twins_do_not(tmp_path):
    """XLA shards the inputs of the reorder by slices and moves their rows across ranks
    (collective_permutes, all_to_alls); read as the zigzag take, each rank its block.
    Twins: the outputs put back by the zigzag order itself; the chunks paired r, r+CP
    while the mask assumes the zigzag pairs."""
    mod = example_module("ring_attention_zigzag")
    res = verify_texts(tmp_path, *compiled_pair(mod.ring_zigzag_causal_sliced(), dumped=True))
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    paired = [c for r in range(mod.CP) for c in (r, r + mod.CP)]
    for order_in, order_out in ((mod.ZIGZAG, mod.ZIGZAG),
                                (paired, [int(i) for i in np.argsort(paired)])):
        case = _sliced(mod, order_in, order_out)
        assert not verify_texts(tmp_path, *compiled_pair(case, dumped=True)).verified


# ------------------------------------------------ the sequential module optimised too

def _both_optimised(tmp_path, case):
    """Both modules as --xla_dump_to writes them after optimisations: XLA builds the
    sequential causal mask from 2-D iotas, where the program broadcast 1-D positions."""
    import jax
    seq = dumped_after_optimizations(jax.jit(case.seq).lower(*case.args))
    return verify_texts(tmp_path, seq, dumped_after_optimizations(case.dist.lower(*case.args)))


def test_an_optimised_sequential_mask_is_permuted_at_its_positions(tmp_path):
    """The 2-D iotas are permuted as the broadcast of their permuted 1-D iota
    (sequence_permutation._Builder.permute_iota), the form the distributed module's
    zigzag positions take; the rewritten module computes what it computed."""
    mod = example_module("ring_attention_zigzag")
    res = _both_optimised(tmp_path, mod.ring_zigzag_causal())
    assert res.verified, [(f.op, f.line, f.message[:200]) for f in res.failures[:2]]
    assert any(n.startswith("the sequential program was rewritten") for n in res.problem.notes)
    _views_hold(res)
    twin = mod.ring_zigzag_bug_local_positions()
    res = _both_optimised(tmp_path, twin)
    assert not res.verified
    assert bug_line(twin.dist) in {fr.line for fr in res.failures[0].frames}


def test_the_permuted_iota_form_keeps_the_outputs(tmp_path):
    import jax
    case = example_module("ring_attention_zigzag").ring_zigzag_causal()
    (tmp_path / "s.hlo").write_text(dumped_after_optimizations(jax.jit(case.seq).lower(*case.args)))
    (tmp_path / "d.hlo").write_text(dumped_after_optimizations(case.dist.lower(*case.args)))
    problem = hlo_problem(tmp_path / "s.hlo", tmp_path / "d.hlo", None, None, IdAllocator())
    assert any(op.kind == "iota" and len(problem.seq.tensors[op.output].shape) == 2
               for op in problem.seq.ops)
    before = copy.deepcopy(problem)
    rewrite(problem)
    assert not any(op.kind == "iota" and len(problem.seq.tensors[op.output].shape) == 2
                   for op in problem.seq.ops)
    for seed in (0, 1):   # the outputs are new tensors (the un-permutes appended): by position
        a, b = run_both(before, seed), run_both(problem, seed)
        for s, t in zip(before.seq.outputs, problem.seq.outputs):
            assert value_error(np.asarray(b.seq[t][0], np.float64),
                               np.asarray(a.seq[s][0], np.float64)) <= 1e-9

"""The order in which the rewrite passes bring both graphs of a problem to the
forms the rules relate: every pass is an exact rewrite of its own module; this
one only says which runs when, and on which graph (the comments say why there).
`rewrite` is what dlverify/api.py calls between the frontends and the facts."""
from __future__ import annotations

from dlverify.problem import Problem
from dlverify.rewrites import _drop_newly_dead, _unused, rewrite_graph, split_contracted_concatenations


def rewrite(problem: Problem) -> None:
    """Rewrite both graphs of `problem` in place."""
    from dlverify.const_layout import fold_constant_layouts
    from dlverify.cell_groups import split_repeated_cells
    from dlverify.collective_sums import split_summed_adds
    from dlverify.cse import merge_common_values
    from dlverify.gather_batching import batch_unit_offset_dims
    from dlverify.masked_gather import rewrite_masked_gathers   # imports this module
    from dlverify.passes import fold, share_nullary
    from dlverify.offset_compare import move_compare_offsets
    from dlverify.real_guards import drop_real_guards
    from dlverify.rounded_reciprocal import match_rounded_reciprocals
    from dlverify.sequence_permutation import permute_sequence
    from dlverify.blocked_scan import block_scans
    from dlverify.reshape_tidy import tidy_reshapes
    from dlverify.resharding import rewrite_reshardings
    from dlverify.simplify import simplify_graph
    from dlverify.simplify_int import fold_int_expansions
    from dlverify.unit_layouts import unit_layouts_as_sequential
    from dlverify.unit_roles import unit_roles_as_sequential
    from dlverify.softmax_form import canonical_softmaxes
    from dlverify.square_forms import square_forms
    unused = [_unused(problem.seq), _unused(problem.dist)]
    if problem.normal_form:   # compiled modules recompute values per fusion (dlverify/cse.py)
        # XLA's integer rem / div and gathers as the programs wrote them (simplify_int.py),
        # and values merged, before the masked gathers are matched across fusions
        fold_int_expansions(problem.seq, problem.ids, None)
        fold_int_expansions(problem.dist, problem.ids, problem.mesh)
        match_rounded_reciprocals(problem.seq, problem.dist, problem.ids, problem.assumptions)
        for g, before in zip((problem.seq, problem.dist), unused):
            share_nullary(g)   # (equal literals of two fusions: one tensor, so their readers merge)
            if fold_constant_layouts(g) | bool(merge_common_values(g)):
                _drop_newly_dead(g, before)
    if permute_sequence(problem):   # before the gathers it writes are matched
        _drop_newly_dead(problem.seq, unused[0])
        _drop_newly_dead(problem.dist, unused[1])
    if block_scans(problem):   # a cumsum along a dim the ranks scan in blocks (SP)
        _drop_newly_dead(problem.seq, unused[0])
    for g, before in zip((problem.seq, problem.dist), unused):   # size-1 offset dims batched
        if batch_unit_offset_dims(g, problem.ids):
            _drop_newly_dead(g, before)
    for g, before in zip((problem.seq, problem.dist), unused):   # (a - c) == iota: one-hots
        guards = not problem.normal_form and drop_real_guards(g, problem.ids)   # (programs as
        if move_compare_offsets(g, problem.ids) | guards:   # written: is_finite, abs of reals)
            _drop_newly_dead(g, before)
    if not problem.normal_form:   # x ** 2 and jnp.square as one op (XLA writes one multiply)
        for g, before in zip((problem.seq, problem.dist), unused):
            if square_forms(g, problem.ids):
                _drop_newly_dead(g, before)
    if not problem.normal_form:   # guards of values finite once index ranges decide a
        # select (jnp.take's NaN fill)
        for g, mesh, before in zip((problem.seq, problem.dist), (None, problem.mesh), unused):
            if drop_real_guards(g, problem.ids, fold(g, mesh).splat):
                _drop_newly_dead(g, before)
    rewrite_masked_gathers(problem)
    if split_summed_adds(problem.dist, problem.ids):   # psum(a + b) -> psum(a) + psum(b)
        _drop_newly_dead(problem.dist, unused[1])
    if split_repeated_cells(problem.dist, problem.ids, problem.mesh):   # psum of shared cells: 2 levels
        _drop_newly_dead(problem.dist, unused[1])
    if rewrite_reshardings(problem):
        _drop_newly_dead(problem.dist, unused[1])
    if canonical_softmaxes(problem.seq, problem.dist, problem.ids):
        _drop_newly_dead(problem.seq, unused[0])
        _drop_newly_dead(problem.dist, unused[1])
    split = not problem.normal_form   # (see _Rewriter.split_contracted)
    rewrite_graph(problem.seq, problem.ids, split)
    if rewrite_graph(problem.dist, problem.ids, split) and split_summed_adds(problem.dist, problem.ids):
        _drop_newly_dead(problem.dist, unused[1])   # (a psum of the pieces of a contraction)
    if problem.normal_form:   # last: the rewrites above match the programs' own structure
        simplify_graph(problem.seq, problem.ids, problem.assumptions, problem.notes)
        simplify_graph(problem.dist, problem.ids, problem.assumptions, problem.notes,
                       partner=problem.seq)
        # (size-1 dims the distributed module deleted, moved as the program moves them)
        # (a contraction of a concatenation on one side only: split, the pieces' dots
        # brought to the normal form, sums of dots left apart)
        for g in split_contracted_concatenations(problem.seq, problem.dist, problem.ids):
            simplify_graph(g, problem.ids, problem.assumptions, problem.notes,
                           partner=problem.seq if g is problem.dist else None, merge_sums=False)
        # (size-1 dims batched, contracted or free as the sequential dot whose operand's
        # sized dims have the same roles: a rank's key gradient of one query head)
        if unit_roles_as_sequential(problem.seq, problem.dist, problem.ids):
            tidy_reshapes(problem.dist, problem.ids)   # (the reshapes back, collapsed)
            _drop_newly_dead(problem.dist, unused[1])
        if unit_layouts_as_sequential(problem.seq, problem.dist, problem.ids):
            _drop_newly_dead(problem.dist, unused[1])
        # (the reshapes back those passes wrote, collapsed and sunk as the normal form would)
        if tidy_reshapes(problem.dist, problem.ids):
            _drop_newly_dead(problem.dist, unused[1])
        # (again: a compiled psum(a + b) may read the add through a reshape the normal
        # form sank out of it)
        if split_summed_adds(problem.dist, problem.ids):
            _drop_newly_dead(problem.dist, unused[1])

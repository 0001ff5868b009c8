"""concat_terms.dl: a concatenation of partial terms of different reductions (the
gradient of a fused weight with the tokens sharded) is a partial term of the
concatenation's family, completed by a psum.

`Tiny.run()` checks every derived view numerically on random data (and that the
partial terms of every complete tiling sum to the sequential value)."""
from rulekit import Tiny

# x^T g: contract the token dim 0 of both
TOK = dict(lhs_contract=(0,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def _fused_grad(t: Tiny, order=(0, 1), tokens=(6, 6)):
    """Sequential concat(x^T g0, x^T g1; dim 1) and its distributed twin over token
    shards; `order` permutes the distributed operands, `tokens` cuts the sequential
    second product to fewer tokens."""
    xs, xd = t.input((6, 4), ("x", None))
    gs, gd = zip(*(t.input((6, 3), ("x", None)) for _ in range(2)))
    xs1 = t.sop("slice", [xs], (tokens[1], 4), start_indices=(0, 0), limit_indices=(tokens[1], 4),
                strides=None)
    gs1 = t.sop("slice", [gs[1]], (tokens[1], 3), start_indices=(0, 0),
                limit_indices=(tokens[1], 3), strides=None)
    ps = [t.sop("dot_general", [xs, gs[0]], (4, 3), **TOK), t.sop("dot_general", [xs1, gs1], (4, 3), **TOK)]
    pd = [t.dop("dot_general", [xd, g], (4, 3), **TOK) for g in gd]
    cat_s = t.sop("concatenate", ps, (4, 6), dimension=1)
    cat_d = t.dop("concatenate", [pd[i] for i in order], (4, 6), dimension=1)
    t.output_negated_psum(cat_s, cat_d, [[0, 1]])
    return cat_s, cat_d


def test_concatenated_partial_terms_are_one_family_completed_by_a_psum():
    t = Tiny()
    cat_s, cat_d = _fused_grad(t)
    out = t.run()
    assert out.result.verified, [f.message for f in out.result.failures]
    tags = {v.partial for v in out.views(cat_s, cat_d)}
    assert len(tags) == 2 and all(p is not None for p in tags)   # one tag per rank, [0:3), [3:6)


def test_operands_in_another_order_are_not_the_family():
    t = Tiny()
    cat_s, cat_d = _fused_grad(t, order=(1, 0))
    out = t.run()
    assert not out.result.verified
    assert out.views(cat_s, cat_d) == []


def test_reductions_with_different_term_counts_are_not_one_family():
    # the second sequential product sums 4 tokens, the first 6: no family of
    # equally many terms (and the distributed one sums all 6 tokens: a bug)
    t = Tiny()
    cat_s, cat_d = _fused_grad(t, tokens=(6, 4))
    out = t.run()
    assert not out.result.verified
    assert out.views(cat_s, cat_d) == []


def _per_tap_grad(t: Tiny, dist_tokens=6):
    """A convolution's kernel gradient as the lowering writes it: one x^T g per tap,
    each reshaped to a unit dim and concatenated along it (taps over token shards);
    `dist_tokens` < 6 drops the last tokens of the distributed second product."""
    xs, xd = t.input((6, 4), ("x", None))
    gs, gd = zip(*(t.input((6, 3), ("x", None)) for _ in range(2)))
    ps = [t.sop("reshape", [t.sop("dot_general", [xs, g], (4, 3), **TOK)], (4, 3, 1))
          for g in gs]
    xd1 = t.dop("slice", [xd], (dist_tokens // 2, 4), start_indices=(0, 0),
                limit_indices=(dist_tokens // 2, 4), strides=None)
    gd1 = t.dop("slice", [gd[1]], (dist_tokens // 2, 3), start_indices=(0, 0),
                limit_indices=(dist_tokens // 2, 3), strides=None)
    pd = [t.dop("reshape", [t.dop("dot_general", [a, g], (4, 3), **TOK)], (4, 3, 1))
          for a, g in ((xd, gd[0]), (xd1, gd1))]
    cat_s = t.sop("concatenate", ps, (4, 3, 2), dimension=2)
    cat_d = t.dop("concatenate", pd, (4, 3, 2), dimension=2)
    t.output_negated_psum(cat_s, cat_d, [[0, 1]])
    return cat_s, cat_d


def test_concatenated_reshapes_of_partial_terms_are_one_family():
    t = Tiny()
    cat_s, cat_d = _per_tap_grad(t)
    out = t.run()
    assert out.result.verified, [f.message for f in out.result.failures]
    assert len({v.partial for v in out.views(cat_s, cat_d)}) == 2


def test_a_reshaped_product_over_fewer_tokens_is_not_the_family():
    t = Tiny()
    cat_s, cat_d = _per_tap_grad(t, dist_tokens=4)
    out = t.run()
    assert not out.result.verified
    assert out.views(cat_s, cat_d) == []

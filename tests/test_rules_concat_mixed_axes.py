"""concat_terms.dl, mixed axes: a concatenation of partial terms of reductions that each
reduce the sharded dim at their own position among their contracted dims (a rank's K and V
gradients of one KV head: dK contracts (query heads, positions) as (j, q), dV as (q, j)) is
a partial term of the concatenation's family, named by the axes' code, completed by a psum.

`Tiny.run()` checks every derived view numerically on random data."""
from rulekit import Tiny

# x^T g over (t, u) in the order (t, u) and in the order (u, t)
TU = dict(lhs_contract=(0, 1), rhs_contract=(0, 1), lhs_batch=(), rhs_batch=())
UT = dict(lhs_contract=(1, 0), rhs_contract=(1, 0), lhs_batch=(), rhs_batch=())


def _mixed(t: Tiny, order=(0, 1), second_tokens="own"):
    """Sequential concat(x^T g0 over (t, u), x^T g1 over (u, t); dim 1), tokens t split over
    the ranks; `order` permutes the distributed operands; `second_tokens` "first" makes
    every rank's second product read the first half of the tokens (a bug)."""
    xs, xd = t.input((6, 2, 4), ("x", None, None))
    gs, gd = zip(*(t.input((6, 2, 3), ("x", None, None)) for _ in range(2)))
    ps = [t.sop("dot_general", [xs, gs[0]], (4, 3), **TU),
          t.sop("dot_general", [xs, gs[1]], (4, 3), **UT)]
    x1, g1 = xd, gd[1]
    if second_tokens == "first":
        # rank r's second product reads rank 0's tokens: an all-gather's first half
        x1 = t.dop("slice", [t.dop("all_gather", [xd], (6, 2, 4), dimension=0, groups=[[0, 1]])],
                   (3, 2, 4), start_indices=(0, 0, 0), limit_indices=(3, 2, 4), strides=None)
        g1 = t.dop("slice", [t.dop("all_gather", [gd[1]], (6, 2, 3), dimension=0,
                                   groups=[[0, 1]])],
                   (3, 2, 3), start_indices=(0, 0, 0), limit_indices=(3, 2, 3), strides=None)
    pd = [t.dop("dot_general", [xd, gd[0]], (4, 3), **TU),
          t.dop("dot_general", [x1, g1], (4, 3), **UT)]
    cat_s = t.sop("concatenate", ps, (4, 6), dimension=1)
    cat_d = t.dop("concatenate", [pd[i] for i in order], (4, 6), dimension=1)
    t.output_negated_psum(cat_s, cat_d, [[0, 1]])
    return cat_s, cat_d


def test_partial_terms_reduced_at_different_positions_are_one_family():
    t = Tiny()
    cat_s, cat_d = _mixed(t)
    out = t.run()
    assert out.result.verified, [f.message for f in out.result.failures]
    tags = {v.partial for v in out.views(cat_s, cat_d)}
    assert len(tags) == 2 and all(p is not None for p in tags)


def test_mixed_operands_in_another_order_are_not_the_family():
    t = Tiny()
    cat_s, cat_d = _mixed(t, order=(1, 0))
    out = t.run()
    assert not out.result.verified
    assert out.views(cat_s, cat_d) == []


def test_a_second_operand_of_the_wrong_tokens_is_not_the_family():
    t = Tiny()
    cat_s, cat_d = _mixed(t, second_tokens="first")
    out = t.run()
    assert not out.result.verified
    assert all(v.partial is None or v.rank == 0 for v in out.views(cat_s, cat_d))

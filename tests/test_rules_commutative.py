"""elementwise.dl: add and mul whose operands are swapped between the programs
(x + y on one side, y + x on the other: XLA folds an addend into a scatter-add's
operand). Every `Tiny.run()` checks each derived view numerically on random data;
the swapped alignment never mixes with the straight one (x + x is not x + y) and
never applies to sub."""
import pytest
from rulekit import Tiny, assert_engines_agree

DOT = dict(lhs_contract=(1,), rhs_contract=(0,), lhs_batch=(), rhs_batch=())


def _blocks(t):
    xs, xd = t.input((4, 6), ("x", None))
    ys, yd = t.input((4, 6), ("x", None))
    return xs, xd, ys, yd


def test_swapped_add_and_mul_keep_the_block():
    t = Tiny()
    xs, xd, ys, yd = _blocks(t)
    adds = t.sop("add", [xs, ys], (4, 6))
    addd = t.dop("add", [yd, xd], (2, 6))
    muls = t.sop("mul", [adds, xs], (4, 6))
    muld = t.dop("mul", [xd, addd], (2, 6))
    t.output(muls, muld, ("x", None))
    out = t.run()
    assert out.result.verified, [f.message for f in out.result.failures]
    for r in range(2):
        assert out.offsets(adds, addd, r) == {(2 * r, 0)}
        assert out.offsets(muls, muld, r) == {(2 * r, 0)}


def _swapped_add_of_two_sums(t: Tiny, read_twice: bool):
    xs, xd = t.input((4, 6), (None, "x"))
    ws, wd = t.input((6, 5), ("x", None))
    vs, vd = t.input((6, 5), ("x", None))
    a_s = t.sop("dot_general", [xs, ws], (4, 5), **DOT)
    a_d = t.dop("dot_general", [xd, wd], (4, 5), **DOT)
    b_s = t.sop("dot_general", [xs, vs], (4, 5), **DOT)
    b_d = t.dop("dot_general", [xd, vd], (4, 5), **DOT)
    ss = t.sop("add", [a_s, b_s], (4, 5))
    sd = t.dop("add", [b_d, a_d], (4, 5))
    if read_twice:   # the partial sum is read by another op too: the psum is not split
        t.dop("exp", [sd], (4, 5))
    t.output(ss, t.dop("all_reduce", [sd], (4, 5), reducer="sum", groups=[[0, 1]]), ())
    return ss, sd


def test_swapped_add_of_terms_of_two_sums_is_nothing():
    t = Tiny()
    ss, sd = _swapped_add_of_two_sums(t, read_twice=True)
    out = t.run()
    # a and b are terms of two different contractions, added in the other order: their
    # sum is no term of either tag, so nothing is derived for it
    assert not out.result.verified
    assert out.views(ss, sd) == []


def test_psum_of_a_swapped_add_of_terms_of_two_sums_is_split_and_verifies():
    """psum(b + a) = psum(b) + psum(a) (dlverify/collective_sums.py): two complete
    values added in the other order."""
    t = Tiny()
    _swapped_add_of_two_sums(t, read_twice=False)
    out = t.run()
    assert out.result.verified, [f.message for f in out.result.failures]


@pytest.mark.parametrize("kind, swapped", [("add", False), ("sub", True)])
def test_mixed_alignments_and_sub_give_nothing(kind, swapped):
    """dist x + x is not seq x + y, though x relates to operand 0 straight and to
    operand 1 swapped (one operand is never read from each alignment); y - x is not
    x - y."""
    t = Tiny()
    xs, xd, ys, yd = _blocks(t)
    s = t.sop(kind, [xs, ys], (4, 6))
    d = t.dop(kind, [yd, xd] if swapped else [xd, xd], (2, 6))
    t.output(s, d, ("x", None))
    out = t.run()
    assert not out.result.verified
    assert out.views(s, d) == []


def test_engines_agree_on_swapped_operands(monkeypatch):
    t = Tiny()
    xs, xd, ys, yd = _blocks(t)
    adds = t.sop("add", [xs, ys], (4, 6))
    addd = t.dop("add", [yd, xd], (2, 6))
    t.output(adds, addd, ("x", None))
    assert_engines_agree(t.problem(), monkeypatch)

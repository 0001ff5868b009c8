"""halo.dl: halo exchange as blocks of a zero-padded sequential tensor.

The sequential side pads x with zeros (a convolution's padding); each rank holds a
block of x, receives its neighbour's edge by collective_permute (the first rank
receives nothing: zeros) and concatenates, or pads its block where it touches the
padding. `Tiny.run()` checks every derived view on random data, so each test is
also a soundness check of the three rules (shift, zeros, extend); each has a twin
that must not relate."""
from rulekit import Tiny, assert_engines_agree

from dlverify.ir import Mesh

R, N, LO = 4, 16, 3          # ranks, sequence, low padding (a causal kernel of 4)
K = N // R


def _padded_seq(t: Tiny, lo: int = LO, hi: int = 0, value: float = 0.0):
    xs, xd = t.input((2, N), (None, "x"))
    ps = t.sop("pad", [xs, t.sconst(value)], (2, N + lo + hi), padding_config=((0, 0, 0), (lo, hi, 0)))
    return xs, xd, ps


def _halo(t: Tiny, xd: int, width: int = LO, shift: int = 1) -> int:
    tail = t.dop("slice", [xd], (2, width), start_indices=(0, K - width), limit_indices=(2, K),
                 strides=None)
    pairs = [(r, r + shift) for r in range(R) if 0 <= r + shift < R]
    return t.dop("collective_permute", [tail], (2, width), pairs=pairs)


def test_a_block_of_the_operand_is_the_shifted_block_of_the_padded_tensor():
    t = Tiny(Mesh(("x",), (R,)))
    xs, xd, ps = _padded_seq(t)
    out = t.run()
    for r in range(R):
        assert (0, r * K + LO) in out.offsets(ps, xd, r)


def test_the_halo_concatenated_with_the_block_is_a_block_of_the_padded_tensor():
    t = Tiny(Mesh(("x",), (R,)))
    xs, xd, ps = _padded_seq(t)
    halo = _halo(t, xd)
    cat = t.dop("concatenate", [halo, xd], (2, K + LO), dimension=1)
    t.output(ps, cat, None)
    out = t.run()
    assert out.offsets(ps, halo, 0) == {(0, 0)}          # zeros, inside the padding
    for r in range(R):
        assert out.offsets(ps, cat, r) == {(0, r * K)}


def test_the_halo_from_the_wrong_side_is_not_a_block():
    t = Tiny(Mesh(("x",), (R,)))
    xs, xd, ps = _padded_seq(t)
    halo = _halo(t, xd, shift=-1)                       # from rank r + 1
    cat = t.dop("concatenate", [halo, xd], (2, K + LO), dimension=1)
    out = t.run()
    assert all(out.offsets(ps, cat, r) == set() for r in range(R))


def test_zeros_wider_than_the_padding_or_a_nonzero_pad_are_not_blocks():
    t = Tiny(Mesh(("x",), (R,)))
    xs, xd, ps = _padded_seq(t, lo=2)
    wide = _halo(t, xd, width=3)                        # rank 0: three zeros, padding is two
    t2 = Tiny(Mesh(("x",), (R,)))
    _, xd2, ps2 = _padded_seq(t2, value=1.0)
    halo2 = _halo(t2, xd2)
    out, out2 = t.run(), t2.run()
    assert out.offsets(ps, wide, 0) == set()
    assert out2.offsets(ps2, halo2, 0) == set() and out2.offsets(ps2, xd2, 1) == set()


def test_a_distributed_pad_into_the_padding_extends_the_block():
    """Image rows split over ranks, the sequential side padded on both sides of both
    dims (a 3x3 SAME conv); each rank exchanges one row with each neighbour and pads
    its columns itself."""
    t = Tiny(Mesh(("x",), (R,)))
    xs, xd = t.input((N, 5), ("x", None))
    ps = t.sop("pad", [xs, t.sconst(0.0)], (N + 2, 7), padding_config=((1, 1, 0), (1, 1, 0)))
    up = t.dop("collective_permute", [t.dop("slice", [xd], (1, 5), start_indices=(K - 1, 0),
                                            limit_indices=(K, 5), strides=None)],
               (1, 5), pairs=[(r, r + 1) for r in range(R - 1)])
    down = t.dop("collective_permute", [t.dop("slice", [xd], (1, 5), start_indices=(0, 0),
                                              limit_indices=(1, 5), strides=None)],
                 (1, 5), pairs=[(r + 1, r) for r in range(R - 1)])
    rows = t.dop("concatenate", [up, xd, down], (K + 2, 5), dimension=0)
    full = t.dop("pad", [rows, t.dconst(0.0)], (K + 2, 7), padding_config=((0, 0, 0), (1, 1, 0)))
    over = t.dop("pad", [rows, t.dconst(0.0)], (K + 2, 9), padding_config=((0, 0, 0), (2, 2, 0)))
    ones = t.dop("pad", [rows, t.dconst(1.0)], (K + 2, 7), padding_config=((0, 0, 0), (1, 1, 0)))
    t.output(ps, full, None)
    out = t.run()
    for r in range(R):
        assert out.offsets(ps, rows, r) == {(r * K, 1)}
        assert out.offsets(ps, full, r) == {(r * K, 0)}
        assert out.offsets(ps, over, r) == set()        # two columns: one past the padding
        assert out.offsets(ps, ones, r) == set()        # pads ones, not zeros


def test_both_engines_derive_the_same_halo_views(monkeypatch):
    t = Tiny(Mesh(("x",), (R,)))
    xs, xd, ps = _padded_seq(t)
    cat = t.dop("concatenate", [_halo(t, xd), xd], (2, K + LO), dimension=1)
    # the output reads the block back through the padded tensor's halo view
    ys = t.sop("slice", [ps], (2, N), start_indices=(0, LO), limit_indices=(2, N + LO), strides=None)
    yd = t.dop("slice", [cat], (2, K), start_indices=(0, LO), limit_indices=(2, K + LO), strides=None)
    t.output(ys, yd, (None, "x"))
    assert_engines_agree(t.problem(), monkeypatch)

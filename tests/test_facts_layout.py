"""Precomputed per-op maps of the exporter (reshape groups, scales)."""
from fractions import Fraction

from dlverify.facts import prime_exponents, reshape_groups, reshape_map, reshape_signature


def test_reshape_split_and_merge_groups():
    assert reshape_groups((4, 2048), (4, 32, 64)) == [([0], [0]), ([1], [1, 2])]
    assert reshape_groups((4, 32, 64), (4, 2048)) == [([0], [0]), ([1, 2], [1])]
    # the sharded version has the same signature when the inner size agrees
    assert reshape_signature((4, 2048), (4, 32, 64)) == reshape_signature((4, 1024), (4, 16, 64))
    assert reshape_signature((4, 2048), (4, 32, 64)) != reshape_signature((4, 1024), (4, 32, 32))


def test_reshape_size_one_dims():
    assert reshape_groups((4, 1), (4,)) == [([0], [0]), ([1], [])]
    assert reshape_groups((8,), (1, 8)) == [([], [0]), ([0], [1])]
    assert reshape_map((8,), (1, 8)) == [(0, 2, -1, 0), (1, 0, 0, 1)]


def test_reshape_map_modes():
    assert reshape_map((4, 2048), (4, 32, 64)) == [(0, 0, 0, 1), (1, 0, 1, 64), (2, 2, -1, 0)]
    assert reshape_map((4, 32, 64), (4, 2048)) == [(0, 0, 0, 1), (1, 1, 1, 64)]
    # not a plain split or merge: no rows, so no rule can apply
    assert reshape_map((6, 4), (4, 6)) == []


def test_prime_exponents():
    assert prime_exponents(Fraction(1, 4)) == (-2, 0, 0, 0)
    assert prime_exponents(Fraction(45, 7)) == (0, 2, 1, -1)
    assert prime_exponents(Fraction(11)) is None
    assert prime_exponents(Fraction(-2)) is None

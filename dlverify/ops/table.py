"""The op-kind table: every IR op kind declared once, with its arity, its family
and algebraic class, its numpy semantics and its fact exporter.

The IR's kind sets (dlverify/ir.py), the constant folder (dlverify/passes.py),
the interpreter behind witnesses and rule tests (dlverify/interpret.py), the
HLO lowering's static folding and the fact export (dlverify/facts.py) all read
this table; tests/test_ops_table.py fails when a kind lacks an entry.
Adding an elementwise op is one `OpKind` line here plus its Datalog rule.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
from scipy import special

from dlverify.ops import export as X
from dlverify.ops import random_bits as R
from dlverify.ops import semantics as E
from dlverify.ops import structural as T
from dlverify.ops.semantics import LocalFn
from dlverify.ops.structural import CollectiveFn


class Family(Enum):
    """What the op does to positions: the rule family it belongs to."""

    ELEMENTWISE = "elementwise"
    LAYOUT = "layout"            # data movement and index-space ops (iota)
    REDUCTION = "reduction"
    CONTRACTION = "contraction"
    SCAN = "scan"
    SORT = "sort"
    COLLECTIVE = "collective"
    SOURCE = "source"            # no operands: constants and rank coordinates
    OPAQUE = "opaque"            # a function the verifier does not know


class Algebra(Enum):
    """How the op's value depends on its operands' values, over the reals."""

    LINEAR = "linear"            # a linear map of all operands together (neg, add, sub)
    BILINEAR = "bilinear"        # linear in each operand separately (mul, dot_general)
    DIVISION = "division"        # linear in the dividend over floats; truncating over integers
    NONLINEAR = "nonlinear"
    DATA_MOVEMENT = "data movement"   # copies operand elements to other positions
    REDUCTION = "reduction"      # combines elements along axes (sum is linear, max is not)
    COLLECTIVE = "collective"    # exchanges values between ranks
    NONE = "none"                # no operand values: constants, iota, axis_index


@dataclass(frozen=True)
class Arity:
    """Operand count: at least `least`, at most `most` (None: any number)."""

    least: int
    most: int | None

    def accepts(self, n: int) -> bool:
        return n >= self.least and (self.most is None or n <= self.most)


NULLARY, UNARY, BINARY, TERNARY = Arity(0, 0), Arity(1, 1), Arity(2, 2), Arity(3, 3)


def at_least(n: int) -> Arity:
    return Arity(n, None)


@dataclass(frozen=True)
class OpKind:
    """One IR op kind. `local` evaluates it on one rank (None: no numeric
    semantics here, NotExecutable); `collective` evaluates it across ranks.
    `copies_operand0`: every output element is an element of operand 0, so a
    one-value ("splat") operand gives a one-value result."""

    name: str
    arity: Arity
    family: Family
    algebra: Algebra
    local: LocalFn | None
    export: X.ExportFn
    collective: CollectiveFn | None = None
    copies_operand0: bool = False


F, A = Family, Algebra


def _unary(name: str, fn: LocalFn, export: X.ExportFn = X.elem_unary,
           algebra: Algebra = A.NONLINEAR) -> OpKind:
    return OpKind(name, UNARY, F.ELEMENTWISE, algebra, fn, export)


def _binary(name: str, fn: LocalFn, export: X.ExportFn = X.elem_nary,
            algebra: Algebra = A.NONLINEAR) -> OpKind:
    return OpKind(name, BINARY, F.ELEMENTWISE, algebra, fn, export)


def _float_unary(name: str, fn) -> OpKind:
    return _unary(name, E.float_only(fn))


def _layout(name: str, arity: Arity, fn: LocalFn | None, export: X.ExportFn = X.only_signature,
            copies_operand0: bool = False) -> OpKind:
    return OpKind(name, arity, F.LAYOUT, A.DATA_MOVEMENT, fn, export, copies_operand0=copies_operand0)


def _reduction(name: str, fn: LocalFn, export: X.ExportFn = X.reduction) -> OpKind:
    return OpKind(name, UNARY, F.REDUCTION, A.REDUCTION, fn, export)


def _collective(name: str, fn: CollectiveFn, export: X.ExportFn) -> OpKind:
    return OpKind(name, UNARY, F.COLLECTIVE, A.COLLECTIVE, None, export, collective=fn)


_KINDS: list[OpKind] = [
    # elementwise, linear and bilinear
    _unary("neg", E.unary(np.negative), X.elem_unary_linear, A.LINEAR),
    _binary("add", E.binary(np.add), X.elem_addsub, A.LINEAR),
    _binary("sub", E.binary(np.subtract), X.elem_addsub, A.LINEAR),
    _binary("mul", E.binary(np.multiply), X.elem_mul, A.BILINEAR),
    _binary("div", E.divide, X.elem_div, A.DIVISION),
    # elementwise unary, nonlinear
    _float_unary("exp", np.exp), _float_unary("exp2", np.exp2), _float_unary("log", np.log),
    _float_unary("log1p", np.log1p), _float_unary("expm1", np.expm1),
    _float_unary("tanh", np.tanh), _float_unary("logistic", special.expit),
    _float_unary("sqrt", np.sqrt), _float_unary("rsqrt", E.rsqrt), _float_unary("cbrt", np.cbrt),
    _float_unary("sin", np.sin), _float_unary("cos", np.cos), _float_unary("tan", np.tan),
    _float_unary("erf", special.erf), _float_unary("erfc", special.erfc),
    _float_unary("erf_inv", special.erfinv), _float_unary("asin", np.arcsin),
    _float_unary("acos", np.arccos), _float_unary("atan", np.arctan),
    _float_unary("sinh", np.sinh), _float_unary("cosh", np.cosh),
    _float_unary("asinh", np.arcsinh), _float_unary("acosh", np.arccosh),
    _float_unary("atanh", np.arctanh), _float_unary("lgamma", special.gammaln),
    _float_unary("digamma", special.psi), _float_unary("reciprocal", E.reciprocal),
    _float_unary("floor", np.floor), _float_unary("ceil", np.ceil),
    _unary("is_finite", E.compare(np.isfinite)),
    _unary("round", E.round_half),
    _unary("abs", E.unary(np.abs)), _unary("sign", E.unary(np.sign)),
    _unary("square", E.unary(np.square)), _unary("integer_pow", E.integer_pow),
    _unary("not", E.bitwise(np.invert)),
    _unary("population_count", E.population_count), _unary("clz", E.clz),
    _unary("convert_to_int", E.convert_to_int), _unary("convert_to_bool", E.convert_to_bool),
    _unary("real", E.float_only(np.real)),
    _unary("imag", E.float_only(np.imag)), _unary("conj", E.float_only(np.conj)),
    # elementwise binary, nonlinear
    _binary("max", E.binary(np.maximum), X.elem_extremum),
    _binary("min", E.binary(np.minimum), X.elem_extremum),
    _binary("pow", E.power), _binary("atan2", E.float_only(np.arctan2)),
    _binary("rem", E.remainder), _binary("nextafter", E.float_only(np.nextafter)),
    _binary("and", E.bitwise(np.bitwise_and)), _binary("or", E.bitwise(np.bitwise_or)),
    _binary("xor", E.bitwise(np.bitwise_xor)),
    _binary("shift_left", E.shift_left), _binary("shift_right_logical", E.shift_right_logical),
    _binary("shift_right_arithmetic", E.shift_right_arithmetic),
    _binary("eq", E.compare(np.equal)), _binary("ne", E.compare(np.not_equal)),
    _binary("lt", E.compare(np.less)), _binary("le", E.compare(np.less_equal)),
    _binary("gt", E.compare(np.greater)), _binary("ge", E.compare(np.greater_equal)),
    _binary("complex", E.complex_of),
    # elementwise n-ary
    OpKind("select_n", at_least(2), F.ELEMENTWISE, A.NONLINEAR, E.select_n, X.select_n),
    OpKind("clamp", TERNARY, F.ELEMENTWISE, A.NONLINEAR, E.clamp, X.elem_nary),
    # layout: data movement and index space
    _layout("broadcast_in_dim", UNARY, T.broadcast_in_dim, X.broadcast_in_dim, copies_operand0=True),
    _layout("reshape", UNARY, T.reshape, X.reshape, copies_operand0=True),
    _layout("transpose", UNARY, T.transpose, X.transpose, copies_operand0=True),
    _layout("rev", UNARY, T.rev, X.rev, copies_operand0=True),
    _layout("slice", UNARY, T.slice_, X.slice_, copies_operand0=True),
    _layout("dynamic_slice", at_least(1), T.dynamic_slice, X.dynamic_slice, copies_operand0=True),
    _layout("dynamic_update_slice", at_least(2), T.dynamic_update_slice),
    _layout("concatenate", at_least(1), T.concatenate, X.concatenate),
    _layout("pad", BINARY, T.pad),
    _layout("gather", BINARY, T.gather, X.gather),
    _layout("scatter", TERNARY, None),
    _layout("scatter_add", TERNARY, None),
    OpKind("iota", NULLARY, F.LAYOUT, A.NONE, E.iota, X.iota),
    # reductions
    _reduction("reduce_sum", T.reduce_sum, X.reduction),
    _reduction("reduce_max", T.reduce_max, X.reduction),
    _reduction("reduce_min", T.reduce_min, X.reduction),
    _reduction("reduce_prod", T.reduce_prod), _reduction("reduce_and", T.reduce_and),
    _reduction("reduce_or", T.reduce_or), _reduction("reduce_xor", T.reduce_xor),
    _reduction("argmax", T.argmax), _reduction("argmin", T.argmin),
    # contraction, scans, sort
    OpKind("dot_general", BINARY, F.CONTRACTION, A.BILINEAR, T.dot_general, X.dot_general),
    OpKind("cumsum", UNARY, F.SCAN, A.LINEAR, T.cumsum, X.along_axis),
    OpKind("cumprod", UNARY, F.SCAN, A.NONLINEAR, T.cumprod, X.along_axis),
    OpKind("cummax", UNARY, F.SCAN, A.NONLINEAR, T.cummax, X.along_axis),
    OpKind("cumlogsumexp", UNARY, F.SCAN, A.NONLINEAR, T.cumlogsumexp, X.along_axis),
    OpKind("cummin", UNARY, F.SCAN, A.NONLINEAR, T.cummin, X.along_axis),
    OpKind("sort", at_least(1), F.SORT, A.NONLINEAR, T.sort, X.along_axis),
    OpKind("top_k", UNARY, F.SORT, A.NONLINEAR, T.top_k, X.along_axis),
    # made by dlverify/softmax_form.py, never by a frontend: each row along `axis` alone
    OpKind("softmax", UNARY, F.SCAN, A.NONLINEAR, T.softmax, X.along_axis),
    # collectives
    _collective("all_reduce", T.all_reduce, X.all_reduce),
    _collective("all_gather", T.all_gather, X.all_gather),
    _collective("reduce_scatter", T.reduce_scatter, X.reduce_scatter),
    _collective("all_to_all", T.all_to_all, X.all_to_all),
    _collective("collective_permute", T.collective_permute, X.collective_permute),
    # sources and opaque ops
    OpKind("constant", NULLARY, F.SOURCE, A.NONE, E.constant, X.constant),
    OpKind("axis_index", NULLARY, F.SOURCE, A.NONE, E.axis_index, X.only_signature),
    OpKind("rng_bit_generator", UNARY, F.OPAQUE, A.NONLINEAR, R.rng_bit_generator,
           X.whole_function),
    OpKind("custom_call", at_least(0), F.OPAQUE, A.NONLINEAR, None, X.only_signature),
    # JAX's PRNG primitives on key data (frontends/jaxpr/prng.py): deterministic
    # functions of their whole operands, run by JAX itself
    OpKind("random_bits", UNARY, F.OPAQUE, A.NONLINEAR, R.random_bits, X.whole_function),
    OpKind("random_split", UNARY, F.OPAQUE, A.NONLINEAR, R.random_split, X.whole_function),
    OpKind("random_fold_in", BINARY, F.OPAQUE, A.NONLINEAR, R.random_fold_in, X.whole_function),
    OpKind("random_seed", UNARY, F.OPAQUE, A.NONLINEAR, R.random_seed, X.whole_function),
    # from an integer type a whole function (a PRNG key's u32[2,2] -> u64[2], random
    # bits -> a float); from a float, related by no rule: equal reals, other bits
    OpKind("bitcast_convert", UNARY, F.OPAQUE, A.NONLINEAR, T.bitcast_convert, X.bitcast_convert),
]

KINDS: dict[str, OpKind] = {k.name: k for k in _KINDS}

# Opaque ops whose results the structural passes (dlverify/reorders.py,
# dlverify/resharding.py) treat as possibly different on every rank, whatever they
# read: custom calls, and the generators of random bits and keys (their state
# operands are rarely literal; assuming less is sound).
RANK_OPAQUE = frozenset(k.name for k in _KINDS
                        if k.family is F.OPAQUE and k.name != "bitcast_convert")


# Layout kinds whose elements all come from their first n operands (None: all).
_DATA_OPERANDS: dict[str, int | None] = {"concatenate": None, "pad": 2, "dynamic_update_slice": 2}


def data_operands(kind: str, n_inputs: int) -> int:
    """How many leading operands every output element of `kind` is copied from
    (0: the kind computes, or moves elements of only some of them by index)."""
    if KINDS[kind].copies_operand0:
        return 1
    if kind not in _DATA_OPERANDS:
        return 0
    n = _DATA_OPERANDS[kind]
    return n_inputs if n is None else n
assert len(KINDS) == len(_KINDS), "an op kind is declared twice"


def kinds(family: Family, algebra: Algebra | None = None, arity: Arity | None = None) -> frozenset[str]:
    """Names of the kinds of one family (and algebraic class, and arity)."""
    return frozenset(k.name for k in _KINDS if k.family is family
                     and (algebra is None or k.algebra is algebra)
                     and (arity is None or k.arity == arity))

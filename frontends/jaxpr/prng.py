"""Exporters of JAX's PRNG primitives and of layout primitives on PRNG key arrays.

A typed key array (`jax.random.key`, or `wrap_key_data` of raw key data) is
carried as its key data: the key array's dims, then one key's (u32[..., 2] for
threefry; walk.ir_shape). So `random_wrap` and `random_unwrap` are identities,
and the generators (`random_bits`, `random_split`, `random_fold_in`,
`random_seed`) become IR ops known only as deterministic functions of their
whole operands (dlverify/ops/random_bits.py runs them through JAX; the Datalog
rules of datalog/whole_fn.dl relate two of them only when every operand is the
same whole value on both sides: the same key gives the same bits, anything
else relates to nothing).

Layout primitives count only the key array's dims in their params; their
exporters here extend the params over the trailing key dims. Those whose plain
exporter already fits key data are walk.KEY_AGNOSTIC; any other primitive on
key arrays is an UnknownOpError naming its line.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dlverify.frontends.jaxpr.walk import KEY_EXPORTERS, Ctx, _loc, _out, is_key, key_shape


def _key_exporter(*names: str):
    def deco(fn):
        for n in names:
            KEY_EXPORTERS[n] = fn
        return fn
    return deco


def _impl_name(impl: Any) -> str:
    """The implementation's name as jax.random.wrap_key_data takes it."""
    name = getattr(impl, "name", None)
    if not isinstance(name, str):   # the PRNGImpl record of JAX 0.10 (pinned) has .name
        raise TypeError(f"PRNG implementation without a name: {impl!r}")
    return name


def _key_dtype_impl(aval: Any) -> str:
    return _impl_name(getattr(aval.dtype, "_impl", None))   # KeyTy._impl: jax is pinned


def _trailing(aval: Any) -> tuple[int, ...]:
    return key_shape(aval.dtype) if is_key(aval) else ()


@_key_exporter("random_wrap", "random_unwrap", "random_clone")
def _identity(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    # key data in, the same key data out: the IR never sees the key type
    return list(ins)


def _generator(key_aval: Any, **params: Any) -> dict:
    """Params of a generator reading the key array `key_aval`: its implementation and
    how many trailing dims of its key data one key takes."""
    return {"impl": _key_dtype_impl(key_aval), "key_rank": len(key_shape(key_aval.dtype)),
            **params}


# At most this many keys of a batch are drawn from one by one (below); a larger batch
# stays one op, related only as a whole.
MAX_PER_KEY = 64


def _generate(ctx: Ctx, eqn: Any, ins: list[int], kind: str, params: dict) -> list[int]:
    """`kind` over a batch of keys (the operands' leading dims, the key array's) as one
    op per key: each key's slice drawn from alone, the results concatenated. Equal by
    the primitives' definition (each maps every key of a batch alone), and what lets a
    rank's block of keys relate: its keys are some of the sequential program's, and
    a whole function relates only whole values (datalog/whole_fn.dl)."""
    shape, dtype = _out(eqn)
    loc = _loc(eqn)
    batch = tuple(int(n) for n in eqn.invars[0].aval.shape)
    count = int(np.prod(batch)) if batch else 1
    g = ctx.b.graph
    if not batch or count > MAX_PER_KEY or any(g.tensors[t].shape[:len(batch)] != batch for t in ins):
        return [ctx.b.op(kind, ins, shape, dtype, params, loc, kind)]
    k, tail = len(batch), shape[len(batch):]
    pieces = []
    for idx in np.ndindex(*batch):
        args = []
        for t in ins:
            ten = g.tensors[t]
            rest = ten.shape[k:]
            cut = ctx.b.op("slice", [t], (1,) * k + rest, ten.dtype, {
                "start_indices": tuple(idx) + (0,) * len(rest),
                "limit_indices": tuple(i + 1 for i in idx) + rest, "strides": None}, loc, kind)
            args.append(ctx.b.op("reshape", [cut], rest, ten.dtype, {}, loc, kind))
        one = ctx.b.op(kind, args, tail, dtype, params, loc, kind)
        pieces.append(ctx.b.op("reshape", [one], (1,) + tail, dtype, {}, loc, kind))
    flat = pieces[0] if count == 1 else ctx.b.op(
        "concatenate", pieces, (count,) + tail, dtype, {"dimension": 0}, loc, kind)
    return [ctx.b.op("reshape", [flat], shape, dtype, {}, loc, kind)]


@_key_exporter("random_bits")
def _bits(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    params = _generator(eqn.invars[0].aval, bit_width=int(eqn.params["bit_width"]),
                        shape=tuple(int(s) for s in eqn.params["shape"]))
    return _generate(ctx, eqn, ins, "random_bits", params)


@_key_exporter("random_split")
def _split(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    params = _generator(eqn.invars[0].aval, shape=tuple(int(s) for s in eqn.params["shape"]))
    return _generate(ctx, eqn, ins, "random_split", params)


@_key_exporter("random_fold_in")
def _fold_in(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    return _generate(ctx, eqn, ins, "random_fold_in", _generator(eqn.invars[0].aval))


@_key_exporter("random_seed")
def _seed(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    return _generate(ctx, eqn, ins, "random_seed", {"impl": _impl_name(eqn.params["impl"])})


# ------------------------------------------------------------- layout on key arrays

@_key_exporter("broadcast_in_dim")
def _broadcast(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    shape, dtype = _out(eqn)
    n = len(eqn.outvars[0].aval.shape)
    dims = tuple(int(d) for d in eqn.params["broadcast_dimensions"])
    dims += tuple(range(n, n + len(_trailing(eqn.outvars[0].aval))))
    return [ctx.b.op("broadcast_in_dim", ins[:1], shape, dtype, {"broadcast_dimensions": dims},
                     _loc(eqn), "broadcast_in_dim")]


@_key_exporter("transpose")
def _transpose(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    shape, dtype = _out(eqn)
    perm = tuple(int(p) for p in eqn.params["permutation"])
    perm += tuple(range(len(perm), len(shape)))
    return [ctx.b.op("transpose", ins, shape, dtype, {"permutation": perm}, _loc(eqn), "transpose")]


@_key_exporter("slice")
def _slice(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    shape, dtype = _out(eqn)
    key = _trailing(eqn.invars[0].aval)
    strides = eqn.params.get("strides")
    return [ctx.b.op("slice", ins, shape, dtype, {
        "start_indices": tuple(int(s) for s in eqn.params["start_indices"]) + (0,) * len(key),
        "limit_indices": tuple(int(s) for s in eqn.params["limit_indices"]) + key,
        "strides": tuple(int(s) for s in strides) + (1,) * len(key) if strides else None},
        _loc(eqn), "slice")]


@_key_exporter("dynamic_slice")
def _dynamic_slice(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    shape, dtype = _out(eqn)
    loc = _loc(eqn)
    key = _trailing(eqn.invars[0].aval)
    idx_dtype = ctx.b.graph.tensors[ins[1]].dtype if len(ins) > 1 else "int32"
    zeros = [ctx.b.constant(np.zeros((), np.dtype(idx_dtype)), (), idx_dtype, loc) for _ in key]
    sizes = tuple(int(s) for s in eqn.params["slice_sizes"]) + key
    return [ctx.b.op("dynamic_slice", ins + zeros, shape, dtype, {"slice_sizes": sizes}, loc,
                     "dynamic_slice")]


@_key_exporter("select_n")
def _select(ctx: Ctx, eqn: Any, ins: list[int]) -> list[int]:
    """select_n(pred, *keys): the predicate picks whole keys, so it is broadcast over
    each key's own dims."""
    shape, dtype = _out(eqn)
    loc = _loc(eqn)
    pred = ctx.b.graph.tensors[ins[0]]
    dims = tuple(range(pred.rank)) if pred.rank else ()
    wide = ctx.b.op("broadcast_in_dim", [ins[0]], shape, pred.dtype,
                    {"broadcast_dimensions": dims}, loc, "select_n")
    return [ctx.b.op("select_n", [wide, *ins[1:]], shape, dtype, {}, loc, "select_n")]

"""`jax.jit` with shardings (automatic SPMD partitioning) -> a Problem over HLO.

For a `dist_fn` that is `jax.jit(f, in_shardings=..., out_shardings=...)` (no
shard_map), the program to verify is what XLA's SPMD partitioner makes of it:
one per-device module with local shapes and the collectives it inserted. It is
taken right after the `spmd-partitioning` pass (dumped with
`xla_dump_hlo_pass_re`), before the later optimisation passes fuse and
re-layout it, so its ops are those of the sequential module modulo
partitioning. The sequential program is `seq_fn` lowered by `jax.jit` on one
device, as HLO text (the module XLA would start optimising from, constants
printed in full), so both sides come through the same importer
(frontends/hlo/).

Input relations come from the partitioned module's parameter shardings
(devices are XLA's logical device ids, which are the ranks); the expected
output relations from the shardings of the module before partitioning (the
`out_shardings`). Parameters the jit dropped as unused get a replicated
stand-in. Large constants are printed in full (`xla_dump_large_constants`) and
collectives with explicit replica groups (`xla_enable_rgv3_materialization`).
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dlverify.errors import InputError
from dlverify.frontends.hlo import HloModule, parse_hlo_module, root_output_relations
from dlverify.frontends.hlo.pairing import ParamPolicy, pair_modules
from dlverify.ir import IdAllocator
from dlverify.problem import Problem

import jax
import jax.extend.core as jcore

DUMP_OPTIONS = {
    "xla_dump_hlo_pass_re": "spmd-partitioning",
    "xla_dump_large_constants": True,
    "xla_enable_rgv3_materialization": False,
}


def uses_shard_map(fn: Callable[..., Any], args: tuple[Any, ...]) -> bool:
    """Whether the jaxpr of `fn` contains a shard_map (at any nesting depth)."""
    try:
        closed = jax.make_jaxpr(fn)(*_abstract(args, keep_sharding=True))
    except Exception:  # noqa: BLE001 - let the shard_map importer report tracing errors
        return True
    return _has_shard_map(closed.jaxpr)


def _has_shard_map(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "shard_map":
            return True
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = sub.jaxpr if isinstance(sub, jcore.ClosedJaxpr) else sub
                if isinstance(inner, jcore.Jaxpr) and _has_shard_map(inner):
                    return True
    return False


def _abstract(args: tuple[Any, ...], keep_sharding: bool) -> tuple[Any, ...]:
    """Arrays -> ShapeDtypeStructs (with their sharding if asked and committed)."""
    def one(a: Any) -> Any:
        sharding = getattr(a, "sharding", None) if keep_sharding else None
        if isinstance(a, jax.ShapeDtypeStruct):
            return a if keep_sharding else jax.ShapeDtypeStruct(a.shape, a.dtype)
        if keep_sharding and isinstance(a, jax.Array) and getattr(a, "committed", False):
            return jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)
        return jax.ShapeDtypeStruct(np.shape(a), np.result_type(a))
    return jax.tree_util.tree_map(one, args)


def _dump(lowered: Any, what: str) -> dict[str, str]:
    """Compile `lowered` with HLO dumps; return {stage: module text} for the
    stages before_optimizations, before_spmd and after_spmd (when present)."""
    with tempfile.TemporaryDirectory(prefix="dlverify-xla-") as d:
        try:
            lowered.compile(compiler_options={"xla_dump_to": d, **DUMP_OPTIONS})
        except Exception as e:  # noqa: BLE001 - XLA's own error, one line
            msg = " ".join(str(e).split())
            raise InputError(f"compiling {what} failed: {type(e).__name__}: {msg[:400]}") from None
        files = sorted(Path(d).glob("module_*.txt"))
        out: dict[str, str] = {}
        for stage, pat in (("after_spmd", r"\.after_spmd-partitioning\."),
                           ("before_spmd", r"\.before_spmd-partitioning\."),
                           ("before_optimizations", r"\.before_optimizations\.txt$")):
            hits = [f for f in files if re.search(pat, f.name)]
            if hits:
                out[stage] = hits[-1].read_text(encoding="utf-8")
        return out


def dumped_after_optimizations(lowered: Any, large_constants: bool = True) -> str:
    """The module after optimisations of `lowered`, as `--xla_dump_to` writes it (large
    constants printed with `xla_dump_large_constants`, else elided as `{...}`): what a
    user's dump folder holds (bench/xla_examples.py, the compiled-example tests)."""
    with tempfile.TemporaryDirectory(prefix="dlverify-xla-") as d:
        lowered.compile(compiler_options={"xla_dump_to": d, "xla_dump_large_constants": large_constants})
        return sorted(Path(d).glob("module_*after_optimizations.txt"))[-1].read_text(encoding="utf-8")


def dumped_after_spmd(lowered: Any) -> str:
    """The module of `lowered` right after the SPMD partitioning pass (as
    `--xla_dump_hlo_pass_re=spmd-partitioning` writes it, large constants printed)."""
    texts = _dump(lowered, "the distributed program")
    if "after_spmd" not in texts:
        raise InputError("XLA wrote no module after the spmd-partitioning pass")
    return texts["after_spmd"]


def _names(args: tuple[Any, ...]) -> list[str]:
    leaves = jax.tree_util.tree_flatten_with_path(args)[0]
    out = []
    for path, _ in leaves:
        key = jax.tree_util.keystr(path)          # "[1][0]['wq']"
        m = re.match(r"\[(\d+)\](.*)$", key)
        out.append(f"in{m.group(1)}{m.group(2)}" if m else f"in{key}")
    return out


def import_jax_compiled(seq_fn: Callable[..., Any], dist_fn: Callable[..., Any],
                        args: tuple[Any, ...], name: str = "") -> Problem:
    """The Problem of `seq_fn` (one device) against the SPMD-partitioned module
    of `dist_fn` (a jax.jit with shardings)."""
    if not hasattr(dist_fn, "lower"):
        raise InputError("dist_fn is neither a jax.shard_map program nor a jax.jit function with "
                         "in_shardings/out_shardings: wrap it in jax.jit(f, in_shardings=..., "
                         "out_shardings=...)")
    try:
        dist_lowered = dist_fn.lower(*_abstract(args, keep_sharding=True))
        seq_lowered = jax.jit(seq_fn, keep_unused=True).lower(*_abstract(args, keep_sharding=False))
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's program failed to trace or lower
        msg = " ".join(str(e).split())
        raise InputError(f"lowering failed: {type(e).__name__}: {msg[:400]}") from None
    dist_texts = _dump(dist_lowered, "dist_fn")
    if "after_spmd" not in dist_texts:
        raise InputError("dist_fn was not partitioned (no SPMD partitioning pass ran): give "
                         "jax.jit in_shardings/out_shardings over a mesh of several devices")
    seq_mod = parse_hlo_module(seq_lowered.as_text(dialect="hlo"), f"<{_fn_name(seq_fn)} hlo>")
    dist_mod = parse_hlo_module(dist_texts["after_spmd"],
                                f"<{_fn_name(dist_fn)} after spmd-partitioning>")
    pre_mod = parse_hlo_module(dist_texts.get("before_spmd")
                               or dist_texts["before_optimizations"], "<dist_fn before partitioning>")
    kept = sorted(dist_lowered._lowering.compile_args["kept_var_idx"])  # private: jax is pinned
    return build_problem(seq_mod, dist_mod, pre_mod, kept, _names(args), name)


def _fn_name(fn: Callable[..., Any]) -> str:
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return getattr(fn, "__name__", "fn")


def build_problem(seq_mod: HloModule, dist_mod: HloModule, pre_mod: HloModule | None,
                  kept: list[int], names: list[str], name: str = "") -> Problem:
    """Pair the one-device module (parameter i = flat argument i) with the
    partitioned one (parameter j = flat argument kept[j]). The partitioned
    parameters' shardings are the user's in_shardings: a parameter whose
    sharding is not an even block is an error, never inferred from shapes."""
    n = (dist_mod.num_partitions or 1) * (dist_mod.replica_count or 1)
    expected = root_output_relations(pre_mod, n) if pre_mod is not None else None
    return pair_modules(seq_mod, dist_mod, IdAllocator(), ranks=n, dist_args=list(kept),
                        input_names=list(names), expected_outputs=expected,
                        policy=ParamPolicy(infer_from_shapes=False, sharding_is_assumption=False),
                        name=name)


__all__ = ["import_jax_compiled", "uses_shard_map", "build_problem", "dumped_after_optimizations",
           "dumped_after_spmd",
           "DUMP_OPTIONS"]

"""The real models (examples/models: GPT-2, Llama-3) and the bug zoo (examples/bugs).

1. Numerics: every case, and every model variant below, run on random data:
   correct programs agree with their sequential version within float
   tolerance, buggy twins differ visibly.
2. Verdicts: correct cases verify; buggy twins do not, and the first failure's
   frames contain the twin's `# BUG` line.
3. Known gaps. Model variants that are correct (their numerics are checked)
   but that the verifier cannot verify yet, and for each gap a minimal program
   reproducing it. They are `xfail(strict=True)` with the missing rule as the
   reason: when a rule lands they XPASS and fail, and the mark must go.
   Variants that do verify are kept too, as regressions for shapes the
   examples do not cover (one KV head per rank at TP=8, as Llama-3 8B/70B/405B;
   fewer KV heads than ranks; one GPT-2 head per rank), and so are the
   reproductions of closed gaps.
"""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from conftest import bug_line
from dlverify.api import verify_jax
from dlverify.case import CASE_MARKER

ROOT = Path(__file__).resolve().parent.parent
FILES = sorted((ROOT / "examples" / "models").glob("*.py")) + \
    sorted((ROOT / "examples" / "bugs").glob("*.py"))
RTOL = ATOL = 1e-4
BUG_MIN_DIFF = 1e-3


def _load(path: Path):
    name = f"_dlverify_models_{path.parent.name}_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


MODULES = {p.stem: _load(p) for p in FILES}
GPT2, LLAMA3 = MODULES["gpt2"], MODULES["llama3"]
CASES = [(p, n) for p in FILES for n, fn in vars(MODULES[p.stem]).items()
         if callable(fn) and getattr(fn, CASE_MARKER, False)]
_BUILT: dict = {}


def _case(path: Path, name: str):
    if (path, name) not in _BUILT:
        _BUILT[(path, name)] = getattr(MODULES[path.stem], name)()
    return _BUILT[(path, name)]


# ---------------------------------------------------------------- variants

def _variant(model, tp, sp, train, **cfg):
    """One layer unless asked: a variant exercises a rule family inside a layer; the
    cases of the model files cover the flow between layers (two layers), and
    llama3_20_layers_tp2_sp_forward depth."""
    cfg = {"layers": 1, **cfg}
    return lambda: model.make_case(tp, sp=sp, train=train, cfg=model.SMALL._replace(**cfg))


# (id, builder, reason if the verifier cannot verify it yet, else None)
VARIANTS = [
    ("llama3_one_kv_group_per_rank_tp4_forward",
     _variant(LLAMA3, 4, False, False, heads=8, kv_heads=4), None),
    ("llama3_one_kv_group_per_rank_tp4_sp_forward",
     _variant(LLAMA3, 4, True, False, heads=8, kv_heads=4), None),
    ("gpt2_qkv_indexed_tp2_train",
     _variant(GPT2, 2, False, True, qkv_split="index"), None),   # pad (padding.dl)
    ("gpt2_positions_dynamic_slice_tp2_sp_train",
     _variant(GPT2, 2, True, True, pos_embed="slice"), None),   # update.dl
    ("gpt2_one_head_per_rank_tp4_forward",
     _variant(GPT2, 4, False, False, heads=4), None),   # layout_algebra.dl
    ("llama3_unfused_swiglu_tp2_sp_train",
     _variant(LLAMA3, 2, True, True, mlp_fused=False), None),   # partials.dl
    ("llama3_one_kv_group_per_rank_tp4_train",
     _variant(LLAMA3, 4, False, True, heads=8, kv_heads=4), None),   # layout_algebra.dl
    ("llama3_kv_heads_replicated_tp4_forward",
     _variant(LLAMA3, 4, False, False, heads=8, kv_heads=2), None),   # partials.dl
    # one KV head (GPT-2: one head) per rank at TP=8, and fewer KV heads than ranks
    ("llama3_one_kv_head_per_rank_tp8_forward",
     _variant(LLAMA3, 8, False, False, heads=16, kv_heads=8), None),
    ("llama3_one_kv_head_per_rank_tp8_train",
     _variant(LLAMA3, 8, False, True, heads=16, kv_heads=8), None),
    ("llama3_one_kv_head_per_rank_tp8_sp_train",
     _variant(LLAMA3, 8, True, True, heads=16, kv_heads=8, seq=16), None),
    # one position per rank: the norm-weight gradient sums the batch only (reduce_squeeze.dl)
    ("llama3_one_position_per_rank_tp2_sp_train",
     _variant(LLAMA3, 2, True, True, seq=2), None),
    ("llama3_kv_heads_replicated_tp8_forward",
     _variant(LLAMA3, 8, False, False, heads=16, kv_heads=4), None),
    ("llama3_kv_heads_replicated_tp4_train",   # partials.dl (Tag_ProdBase), rect_ranges.dl,
     _variant(LLAMA3, 4, False, True, heads=8, kv_heads=2), None),   # cell_groups.py
    ("llama3_kv_heads_replicated_tp8_sp_train",   # each KV head on 4 ranks, under SP
     _variant(LLAMA3, 8, True, True, heads=16, kv_heads=2, seq=16), None),
    ("gpt2_one_head_per_rank_tp8_forward",
     _variant(GPT2, 8, False, False, heads=8), None),
    ("gpt2_one_head_per_rank_tp8_train",
     _variant(GPT2, 8, False, True, heads=8), None),
    ("gpt2_one_head_per_rank_tp8_sp_train",
     _variant(GPT2, 8, True, True, heads=8, seq=16), None),
    ("gpt2_one_position_per_rank_tp2_sp_train",   # reduce_squeeze.dl
     _variant(GPT2, 2, True, True, seq=2), None),
    ("llama3_20_layers_tp2_sp_forward",   # deep enough to be verified segment by segment
     _variant(LLAMA3, 2, True, False, layers=20), None),
    ("llama3_bfloat16_tp2_forward",
     _variant(LLAMA3, 2, False, False, dtype="bfloat16"),
     None),
]
_VARIANT_CASES: dict = {}


def _variant_case(vid, builder):
    if vid not in _VARIANT_CASES:
        _VARIANT_CASES[vid] = builder()
    return _VARIANT_CASES[vid]


# ---------------------------------------------------------------- numerics

def _materialize(case, seed=0):
    rng = np.random.default_rng(seed)
    high = int(case.options.get("token_range", 2))
    out = []
    for a in case.args:
        assert isinstance(a, jax.ShapeDtypeStruct)
        if np.issubdtype(a.dtype, np.integer):
            out.append(rng.integers(0, high, a.shape).astype(a.dtype))
        else:
            out.append(rng.standard_normal(a.shape).astype(np.float32).astype(a.dtype))
    return out


def _max_abs_diff(seq_out, dist_out, rtol, atol):
    """Largest |seq - dist| over the outputs, and whether every output is within
    atol + rtol * (its largest |seq| value)."""
    s_leaves, s_tree = jax.tree.flatten(seq_out)
    d_leaves, d_tree = jax.tree.flatten(dist_out)
    assert s_tree == d_tree, f"output pytrees differ: {s_tree} vs {d_tree}"
    diff, close = 0.0, True
    for s, d in zip(s_leaves, d_leaves):
        s, d = np.asarray(s, np.float64), np.asarray(d, np.float64)
        assert s.shape == d.shape
        err = float(np.max(np.abs(s - d), initial=0.0))
        diff = max(diff, err)
        close = close and err <= atol + rtol * float(np.max(np.abs(s), initial=0.0))
    return diff, close


# XLA's CPU compile of the training graphs dominates this file's run time; the
# numbers do not need an optimised executable.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
_SEQ_OUT: dict = {}


def _run(fn, args):
    return jax.jit(fn).lower(*args).compile(_FAST_COMPILE)(*args)


def _seq_key(fn, depth=0):
    """Sequential functions built by the same factory with the same config compute
    the same thing: run them once. The key is the code and the closure's values,
    closed-over functions by their own keys."""
    if not callable(fn) or not hasattr(fn, "__code__") or depth > 4:
        return fn
    cells = []
    for c in fn.__closure__ or ():
        v = c.cell_contents
        cells.append(_seq_key(v, depth + 1) if callable(v) and hasattr(v, "__code__") else v)
    key = (fn.__code__, tuple(cells))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _run_numerics(case, rtol=RTOL, atol=ATOL):
    args = _materialize(case)
    key = _seq_key(case.seq)
    if key is None or key not in _SEQ_OUT:
        out = _run(case.seq, args)
        if key is not None:
            _SEQ_OUT[key] = out
    seq_out = _SEQ_OUT[key] if key is not None else out
    diff, close = _max_abs_diff(seq_out, _run(case.dist, args), rtol, atol)
    if case.expect == "verified":
        assert close, f"correct program disagrees with its reference: max abs diff {diff:.3g}"
    else:
        assert diff > BUG_MIN_DIFF, f"buggy twin agrees with its reference: max abs diff {diff:.3g}"


def test_cases_were_found():
    names = {n for _, n in CASES}
    assert len(jax.devices()) >= 8
    for model in ("gpt2", "llama3"):
        for tp in (2, 4):
            for sp in ("", "_sp"):
                for what in ("forward", "train"):
                    assert f"{model}_tp{tp}{sp}_{what}" in names
    bugs = [n for p, n in CASES if p.parent.name == "bugs"]
    assert len([n for n in bugs if n.endswith("_bug")]) == 9


@pytest.mark.parametrize("path,name", CASES, ids=[n for _, n in CASES])
def test_case_numerics(path, name):
    _run_numerics(_case(path, name))


@pytest.mark.parametrize("vid,builder", [(v, b) for v, b, _ in VARIANTS],
                         ids=[v for v, _, _ in VARIANTS])
def test_variant_numerics(vid, builder):
    case = _variant_case(vid, builder)
    bf16 = any(a.dtype == jnp.bfloat16 for a in case.args)
    _run_numerics(case, *((3e-2, 3e-2) if bf16 else (RTOL, ATOL)))


# ---------------------------------------------------------------- verdicts

@pytest.mark.parametrize("path,name", CASES, ids=[n for _, n in CASES])
def test_case_verdict_and_location(path, name, example_runs):
    run = example_runs.run(path, name)  # shared with tests/test_examples_e2e.py
    c, res = run.case, run.result
    if c.expect == "verified":
        assert res.verified, [f"{f.op} at line {f.line}: {f.message}" for f in res.failures[:3]]
        return
    assert not res.verified, res.outputs
    line = bug_line(c.dist)
    frames = {fr.line for fr in res.failures[0].frames if fr.file == str(path)}
    assert line in frames, (f"expected the first failure at line {line}, got "
                            f"{[(f.op, f.line, f.message) for f in res.failures[:3]]}")


def _xfail_if(reason):
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


@pytest.mark.parametrize("vid,builder", [
    pytest.param(v, b, marks=_xfail_if(r), id=v) for v, b, r in VARIANTS])
def test_variant_verdict(vid, builder):
    c = _variant_case(vid, builder)
    res = verify_jax(c.seq, c.dist, *c.args, engine="clingo", name=vid)
    assert res.verified, [f"{f.op} at line {f.line}: {f.message}" for f in res.failures[:3]]


# ------------------------------------------- minimal reproductions of the gaps

def _mesh(*shape, names=("tp",)):
    n = int(np.prod(shape))
    return Mesh(np.array(jax.devices()[:n]).reshape(shape), names)


def _sds(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


def _repro_pad():
    def f(x):   # the gradient of an indexed slice is a pad
        return jax.grad(lambda x: jnp.sum(x[:, 0] * x[:, 1]))(x)
    return f, jax.shard_map(f, mesh=_mesh(2), in_specs=P("tp"), out_specs=P("tp")), (_sds(8, 2, 4),)


def _repro_dynamic_update_slice():
    def seq(table, g):
        return jax.grad(lambda t: jnp.sum(t * g))(table)

    def local(table, g):   # each rank reads its rows of a replicated table
        r = jax.lax.axis_index("tp")
        return jax.grad(lambda t: jnp.sum(jax.lax.dynamic_slice_in_dim(t, r * 4, 4) * g))(table)
    return seq, jax.shard_map(local, mesh=_mesh(2), in_specs=(P(), P("tp")), out_specs=P()), \
        (_sds(8, 4), _sds(8, 4))


def _repro_add_of_different_partials():
    def seq(x, a, b):
        return x @ a + x @ b

    def local(x, a, b):
        return jax.lax.psum(x @ a + x @ b, "tp")
    return seq, jax.shard_map(local, mesh=_mesh(2), out_specs=P(),
                              in_specs=(P(None, "tp"), P("tp", None), P("tp", None))), \
        (_sds(4, 8), _sds(8, 4), _sds(8, 4))


def _repro_two_partial_contracted_dims():
    def seq(o, w):
        return jnp.einsum("bgj,gjd->bd", o, w)

    def local(o, w):
        return jax.lax.psum(jnp.einsum("bgj,gjd->bd", o, w), ("a", "b"))
    return seq, jax.shard_map(local, mesh=_mesh(2, 2, names=("a", "b")), out_specs=P(),
                              in_specs=(P(None, "a", "b"), P("a", "b", None))), \
        (_sds(4, 2, 4), _sds(2, 4, 8))


def _repro_partial_operand_over_held_blocks():
    # a KV head's K gradient is partial over its query heads (here: the hidden units f),
    # then contracted over the KV heads (g), of which a rank holds one block
    def seq(h, w, c):
        return jnp.einsum("tg,tgd->td", c, jnp.einsum("tgf,gfd->tgd", h, w))

    def local(h, w, c):
        return jax.lax.psum(seq(h, w, c), ("a", "b"))
    return seq, jax.shard_map(local, mesh=_mesh(2, 2, names=("a", "b")), out_specs=P(),
                              in_specs=(P(None, "a", "b"), P("a", "b", None), P(None, "a"))), \
        (_sds(4, 4, 8), _sds(4, 8, 3), _sds(4, 4))


def _repro_reshape_size1_local_dim():
    return (lambda x: x.reshape(4, 4, 2)), \
        jax.shard_map(lambda x: x.reshape(4, 1, 2), mesh=_mesh(4), in_specs=P(None, "tp"),
                      out_specs=P(None, "tp", None)), (_sds(4, 8),)


def _repro_broadcast_size1_local_dim():
    def f(x, c):   # c (1, 8) broadcast along dim 0: the rank's (1, 8) block needs no broadcast
        return x * c
    return f, jax.shard_map(f, mesh=_mesh(4), in_specs=(P("tp", None), P()),
                            out_specs=P("tp", None)), (_sds(4, 8), _sds(1, 8))


def _repro_broadcast_transpose_size1_local_dim():
    def f(x):
        return jax.grad(lambda x: jnp.sum(x / jnp.sum(x, axis=-1, keepdims=True) * x))(x)
    return f, jax.shard_map(f, mesh=_mesh(4), in_specs=P(None, "tp", None),
                            out_specs=P(None, "tp", None)), (_sds(2, 4, 8),)


def _repro_batch_sum_one_position_per_rank():
    def f(x, w):   # the gradient of a weight broadcast over batch and positions (a norm's)
        return jax.grad(lambda w: jnp.sum(x * w))(w)
    # one position per rank: JAX sums the batch only and keeps the local size-1 position dim
    return f, jax.shard_map(f, mesh=_mesh(2), in_specs=(P(None, "tp", None), P()),
                            out_specs=P()), (_sds(2, 2, 4), _sds(4))


def _repro_bfloat16_cast():
    def seq(x):   # jnp.sum of bf16 reduces in f32 and casts back to bf16
        return jnp.sum(x, axis=1)

    def local(x):
        return jax.lax.psum(jnp.sum(x, axis=1), "tp")
    return seq, jax.shard_map(local, mesh=_mesh(2), in_specs=P(None, "tp"), out_specs=P()), \
        (_sds(4, 8, dtype=jnp.bfloat16),)


# (reproduction, reason if the verifier cannot verify it yet, else None). Each was a
# gap of issue 10 and is now a regression test of the rule family that closed it.
REPROS = [
    (_repro_pad, None),                                  # padding.dl
    (_repro_dynamic_update_slice, None),                 # update.dl
    (_repro_add_of_different_partials, None),            # partials.dl
    (_repro_two_partial_contracted_dims, None),          # partials.dl
    (_repro_partial_operand_over_held_blocks, None),     # partials.dl (Tag_ProdBase)
    (_repro_reshape_size1_local_dim, None),              # layout_algebra.dl
    (_repro_broadcast_size1_local_dim, None),            # layout_algebra.dl
    (_repro_broadcast_transpose_size1_local_dim, None),  # layout_algebra.dl
    (_repro_batch_sum_one_position_per_rank, None),      # reduce_squeeze.dl
]


@pytest.mark.parametrize("make,reason", [
    pytest.param(m, r, marks=_xfail_if(r), id=m.__name__[7:]) for m, r in REPROS])
def test_gap_reproduction(make, reason):
    seq, local, args = make()
    res = verify_jax(seq, jax.jit(local), *args, engine="clingo")
    assert res.verified, [f"{f.op}: {f.message}" for f in res.failures[:2]]


def test_bfloat16_casts_are_precision_casts():
    """f32 <-> bf16 casts are identities over the reals (once a gap: bfloat16 is not
    np.floating, and the casts were exported as a nonlinear conversion)."""
    seq, local, args = _repro_bfloat16_cast()
    res = verify_jax(seq, jax.jit(local), *args, engine="clingo")
    assert res.verified, [f"{f.op}: {f.message}" for f in res.failures[:2]]


def test_gap_reproductions_are_correct_programs():
    """The reproductions compute what their sequential versions compute."""
    rng = np.random.default_rng(0)
    for make, _ in REPROS:
        seq, local, args = make()
        xs = [(rng.standard_normal(a.shape) + 3).astype(a.dtype) for a in args]
        tol = 5e-2 if any(a.dtype == jnp.bfloat16 for a in args) else 1e-4
        diff, close = _max_abs_diff(seq(*xs), jax.jit(local)(*xs), tol, tol)
        assert close, (make.__name__, diff)


def test_size2_control_verifies():
    """The broadcast-transpose reproduction verifies when the local dim has size 2:
    the gap is the size-1 dim, not the pattern."""
    def f(x):
        return jax.grad(lambda x: jnp.sum(x / jnp.sum(x, axis=-1, keepdims=True) * x))(x)
    dist = jax.jit(jax.shard_map(f, mesh=_mesh(2), in_specs=P(None, "tp", None),
                                 out_specs=P(None, "tp", None)))
    assert verify_jax(f, dist, _sds(2, 4, 8), engine="clingo").verified

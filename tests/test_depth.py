"""Depth: chains of 10,000 elementwise ops verify from HLO text and from JAX, and a
chain that differs in one op deep down is rejected at that op (issue 8, item 4).

Before the frontier-driven schedule any chain above ~3,200 ops came out "not
verified": the windows advanced on a fixed clock and fell behind the
derivation. The 100,000-op chain is measured in bench/bench_chain.py, not here.
"""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_problem
from dlverify.frontends.jaxpr import import_jax
from dlverify.hlo_api import verify_hlo

DEPTH = 10_000
BAD_AT = 7_001  # the op of the buggy twin that differs (1-based, in the chain)


def chain_hlo(name: str, shape: tuple[int, ...], depth: int, bad_at: int | None = None) -> str:
    """An HLO module: `depth` elementwise ops cycling multiply, add, tanh on one value;
    op number `bad_at` is an exponential instead."""
    ty = f"f32[{','.join(map(str, shape))}]"
    lines = [f"HloModule {name}", "", f"ENTRY %main (p0: {ty}) -> {ty} {{",
             f"  %p0 = {ty} parameter(0)",
             "  %c = f32[] constant(1.5)",
             f"  %b = {ty} broadcast(%c), dimensions={{}}"]
    x = "%p0"
    for i in range(1, depth + 1):
        root = "ROOT " if i == depth else ""
        if i == bad_at:
            expr = f"exponential({x})"
        else:
            expr = [f"multiply({x}, %b)", f"add({x}, %b)", f"tanh({x})"][i % 3]
        lines.append(f"  {root}%x{i} = {ty} {expr}")
        x = f"%x{i}"
    lines.append("}")
    return "\n".join(lines) + "\n"


def _write_pair(tmp_path, bad_at=None):
    seq = tmp_path / "seq.hlo"
    dist = tmp_path / "dist.hlo"
    spec = tmp_path / "spec.toml"
    seq.write_text(chain_hlo("chain_seq", (8, 4), DEPTH))
    dist.write_text(chain_hlo("chain_dist", (4, 4), DEPTH, bad_at))
    spec.write_text("ranks = 2\n[params]\n0 = { split = 0 }\n[outputs]\n0 = { concat = 0 }\n")
    return seq, dist, spec


def test_hlo_chain_of_10000_ops_verifies(tmp_path):
    res = verify_hlo(*_write_pair(tmp_path), engine="clingo")
    assert res.verified, res.failures[:3]
    assert res.outputs == ["out0 = concat(r0.out0, r1.out0; dim 0)"]
    # Evaluated in segments, never re-run as one fixpoint.
    assert any("segments" in n for n in res.notes)
    assert not any("one fixpoint" in n for n in res.notes)


def test_hlo_chain_with_one_wrong_op_deep_down_is_located(tmp_path):
    res = verify_hlo(*_write_pair(tmp_path, bad_at=BAD_AT), engine="clingo")
    assert not res.verified
    assert res.failures, "a failing verdict names where derivation stopped"
    first = res.failures[0]
    assert first.op == "exp", first
    assert first.line == BAD_AT + 6  # six header lines precede %x1 in dist.hlo


def _tanh_chain(x):
    for _ in range(DEPTH):
        x = jnp.tanh(x)
    return x


def test_jax_chain_of_10000_ops_verifies():
    mesh = dlverify.host_mesh((2,), ("x",))
    dist = jax.jit(jax.shard_map(_tanh_chain, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    args = (jax.ShapeDtypeStruct((8, 4), jnp.float32),)
    problem = import_jax(_tanh_chain, dist, args, name="tanh_chain")
    assert len(problem.dist.ops) >= DEPTH
    res = verify_problem(problem, engine="clingo")
    assert res.verified, res.failures[:3]
    assert not any("one fixpoint" in n for n in res.notes)

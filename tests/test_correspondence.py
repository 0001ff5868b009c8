"""dlverify/correspondence.py: a wrong slice that is still a valid block of some
sequential value is found by its counterpart, the sequential op of the same kind
at the same source line, before the first op with no relation."""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify
from dlverify.api import verify_jax

D = 4


def scores(qkv, k_start):
    """One helper both programs call (as a model's layer code is)."""
    q = qkv[:, :D]
    k = qkv[:, k_start:k_start + D]     # SLICE
    return (q * k).sum(-1)              # PRODUCT


def seq(qkv):
    return scores(qkv, D)


def local_bug(qkv):
    return scores(qkv, 0)   # BUG: the keys read at the queries' columns


def _dist(f):
    mesh = dlverify.host_mesh((2,), ("dp",))
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("dp", None),), out_specs=P("dp")))


ARG = jax.ShapeDtypeStruct((8, 3 * D), jnp.float32)


def _line(fn, marker):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, s in enumerate(lines) if marker in s)


def test_a_wrong_slice_is_reported_at_its_line_by_its_counterpart():
    res = verify_jax(seq, _dist(local_bug), ARG, engine="clingo")
    assert not res.verified
    first = res.failures[0]
    assert (first.kind, first.op, first.line) == ("differs-from-counterpart", "slice",
                                                  _line(scores, "# SLICE"))
    assert _line(local_bug, "# BUG") in {fr.line for fr in first.frames}
    # rank 0 holds its rows of the queries' columns [0:4) of the input, where the
    # sequential slice at that line computes the keys
    assert "holds block [0:4, 0:4] of in0 (rank 0)" in first.message
    assert f"(slice at test_correspondence.py:{_line(scores, '# SLICE')})" in first.message
    # the op with no relation follows, as before
    assert any(f.kind != "differs-from-counterpart" and f.line == _line(scores, "# PRODUCT")
               for f in res.failures[1:])


def test_no_diagnosis_on_a_correct_program_or_when_every_slice_matches_its_counterpart():
    assert verify_jax(seq, _dist(seq), ARG, engine="clingo").verified

    def local_scaled(qkv):
        return scores(qkv, D) * 2.0   # right slices, a wrong scale afterwards

    res = verify_jax(seq, _dist(local_scaled), ARG, engine="clingo")
    assert not res.verified
    assert all(f.kind != "differs-from-counterpart" for f in res.failures)


def test_a_slice_straddling_two_segments_is_flagged_too():
    def local_cross(qkv):
        return scores(qkv, D // 2)   # columns [2:6): a block of the input, of neither Q nor K

    res = verify_jax(seq, _dist(local_cross), ARG, engine="clingo")
    assert (res.failures[0].kind, res.failures[0].line) == ("differs-from-counterpart",
                                                            _line(scores, "# SLICE"))

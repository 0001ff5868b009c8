"""Which frame a failure is reported at (frontends/jaxpr/frames.py): a collective
wrapped in a thin helper, in another module or in the program's own file, is
reported at the caller's line; a one-line function that computes keeps its own
line; the whole chain stays in `Failure.frames`."""
from __future__ import annotations

import importlib.util
import textwrap

import pytest

from dlverify.api import verify_jax
from dlverify.frontends.jaxpr.frames import _Wrappers, primary_frame
from dlverify.ir import Frame
from dlverify.reports.text import failure_line

COMM = '''\
from jax import lax


def allreduce(x, axis):
    return lax.psum(x, axis)
'''

PROGRAM = '''\
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

import dlverify
from comm import allreduce


def reduce_on(x, axis):
    return jax.lax.psum(x, axis)


def seq(x, w1, w2):
    return jnp.tanh(x @ w1) @ w2


def local_helper_module(x, w1, w2):
    h = jnp.tanh(x @ w1)
    return allreduce(h @ w2, "b")                       # WRONG-AXIS-1


def local_same_file(x, w1, w2):
    h = jnp.tanh(x @ w1)
    return reduce_on(h @ w2, "b")                       # WRONG-AXIS-2


def local_computing(x, w1, w2):
    return jax.lax.psum(jnp.tanh(x @ w1) @ w2, "b")     # WRONG-AXIS-3


def dist(local):
    mesh = dlverify.host_mesh((2, 2), ("a", "b"))
    spec = (P(), P(None, "a"), P("a", None))
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=spec, out_specs=P(),
                                 check_vma=False))
'''


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    d = tmp_path_factory.mktemp("frames")
    (d / "comm.py").write_text(COMM)
    (d / "prog.py").write_text(PROGRAM)
    import sys
    sys.path.insert(0, str(d))
    try:
        spec = importlib.util.spec_from_file_location("prog_frames", d / "prog.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(d))
    return mod, d


def _line(text: str, marker: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if marker in s)


def _args():
    import jax
    import jax.numpy as jnp
    f = jnp.float32
    return (jax.ShapeDtypeStruct((4, 8), f), jax.ShapeDtypeStruct((8, 8), f),
            jax.ShapeDtypeStruct((8, 8), f))


@pytest.mark.parametrize("local,marker", [
    ("local_helper_module", "WRONG-AXIS-1"), ("local_same_file", "WRONG-AXIS-2"),
    ("local_computing", "WRONG-AXIS-3")])
def test_wrong_axis_reported_at_the_callers_line(program, local, marker):
    mod, d = program
    res = verify_jax(mod.seq, mod.dist(getattr(mod, local)), *_args(), engine="clingo")
    assert not res.verified
    first = res.failures[0]
    assert (first.file, first.line) == (str(d / "prog.py"), _line(PROGRAM, marker)), \
        [(f.op, f.file, f.line, f.message) for f in res.failures[:3]]
    # the chain still holds the helper's own frame, innermost first
    if local == "local_helper_module":
        assert first.frames[0] == Frame(str(d / "comm.py"), 5, "allreduce")
        assert "(through allreduce at " in failure_line(first)
    if local == "local_same_file":
        assert first.frames[0].line == _line(PROGRAM, "return jax.lax.psum(x, axis)")


def test_primary_frame_rules(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(textwrap.dedent('''\
        def thin(x):
            """doc"""
            return f(x, "a")
        def computes(x):
            return f(g(x) + 1)
        def body(x):
            y = thin(x)
            return computes(y)
        '''))
    w = _Wrappers()
    f = str(src)
    thin, comp, caller = Frame(f, 3, "thin"), Frame(f, 5, "computes"), Frame(f, 7, "body")
    other = Frame(str(tmp_path / "lib.py"), 1, "lib")
    assert primary_frame((thin, caller), f, w) == 1           # past a thin wrapper
    assert primary_frame((comp, caller), f, w) == 0           # a computing one-liner stays
    assert primary_frame((other, thin, caller), f, w) == 2    # other file, then the wrapper
    assert primary_frame((thin,), f, w) == 0                  # no caller left in the file
    assert primary_frame((other,), f, w) == 0                 # no frame in the program's file
    assert primary_frame((), f, w) == 0

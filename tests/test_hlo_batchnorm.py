"""HLO batch-norm-training, batch-norm-inference and batch-norm-grad, expanded
into their definitions (XLA's operation semantics): they compute what the
formulas compute (the grad outputs equal jax.vjp of the training formula);
a batch norm whose features are split across ranks verifies, one whose batch is
split (local statistics, no all-reduce) does not and is located at its line;
malformed instructions are one-line errors."""
# XLA_FLAGS (8 host devices, explicit replica groups): tests/conftest.py
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hlo_pairs import assert_pair_verifies, verify_texts  # noqa: E402

from dlverify.errors import InputError  # noqa: E402
from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module  # noqa: E402
from dlverify.interpret import Interpreter  # noqa: E402
from dlverify.ir import IdAllocator  # noqa: E402

EPS = 1e-3
ALL_THREE = f"""HloModule m

ENTRY %main (x: f32[4,3,5], s: f32[3], o: f32[3], dy: f32[4,3,5]) -> (f32[4,3,5], f32[3], f32[3], f32[4,3,5], f32[4,3,5], f32[3], f32[3]) {{
  %x = f32[4,3,5]{{2,1,0}} parameter(0)
  %s = f32[3]{{0}} parameter(1)
  %o = f32[3]{{0}} parameter(2)
  %dy = f32[4,3,5]{{2,1,0}} parameter(3)
  %t = (f32[4,3,5]{{2,1,0}}, f32[3]{{0}}, f32[3]{{0}}) batch-norm-training(%x, %s, %o), epsilon={EPS}, feature_index=1
  %y = f32[4,3,5]{{2,1,0}} get-tuple-element(%t), index=0
  %m = f32[3]{{0}} get-tuple-element(%t), index=1
  %v = f32[3]{{0}} get-tuple-element(%t), index=2
  %yi = f32[4,3,5]{{2,1,0}} batch-norm-inference(%x, %s, %o, %m, %v), epsilon={EPS}, feature_index=1
  %g = (f32[4,3,5]{{2,1,0}}, f32[3]{{0}}, f32[3]{{0}}) batch-norm-grad(%x, %s, %m, %v, %dy), epsilon={EPS}, feature_index=1
  %gx = f32[4,3,5]{{2,1,0}} get-tuple-element(%g), index=0
  %gs = f32[3]{{0}} get-tuple-element(%g), index=1
  %go = f32[3]{{0}} get-tuple-element(%g), index=2
  ROOT %r = (f32[4,3,5]{{2,1,0}}, f32[3]{{0}}, f32[3]{{0}}, f32[4,3,5]{{2,1,0}}, f32[4,3,5]{{2,1,0}}, f32[3]{{0}}, f32[3]{{0}}) tuple(%y, %m, %v, %yi, %gx, %gs, %go)
}}
"""


def lower(text: str):
    return hlo_to_graph(parse_hlo_module(text, "t.hlo"), IdAllocator(), "g")


def line_of(text: str, start: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith(start))


def training_formula(x, s, o):
    mu = x.mean(axis=(0, 2), keepdims=True)
    var = ((x - mu) ** 2).mean(axis=(0, 2), keepdims=True)
    return (x - mu) / jnp.sqrt(var + EPS) * s[None, :, None] + o[None, :, None]


def test_expansions_compute_the_definitions():
    g, info = lower(ALL_THREE)
    assert info.assumptions == []      # definitions, not assumptions
    rng = np.random.default_rng(0)
    x, s, o, dy = (rng.standard_normal(sh).astype(np.float32)
                   for sh in ((4, 3, 5), (3,), (3,), (4, 3, 5)))
    vals = Interpreter(g, 1).run([[x], [s], [o], [dy]])
    y, mean, var, y_inf, gx, gs, go = (vals[t][0] for t in g.outputs)
    want_y, vjp = jax.vjp(training_formula, x, s, o)
    want_gx, want_gs, want_go = vjp(dy)
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y, want_y, **tol)
    np.testing.assert_allclose(mean, x.mean(axis=(0, 2)), **tol)
    np.testing.assert_allclose(var, x.var(axis=(0, 2)), **tol)
    np.testing.assert_allclose(y_inf, want_y, **tol)
    # batch-norm-grad with the batch statistics is the gradient of the training formula
    np.testing.assert_allclose(gx, want_gx, **tol)
    np.testing.assert_allclose(gs, want_gs, **tol)
    np.testing.assert_allclose(go, want_go, **tol)


def pair_module(rows: int, features: int, parts: int) -> str:
    return f"""HloModule m, num_partitions={parts}

ENTRY %main (x: f32[{rows},{features}], s: f32[{features}], o: f32[{features}]) -> f32[{rows},{features}] {{
  %x = f32[{rows},{features}]{{1,0}} parameter(0)
  %s = f32[{features}]{{0}} parameter(1)
  %o = f32[{features}]{{0}} parameter(2)
  %t = (f32[{rows},{features}]{{1,0}}, f32[{features}]{{0}}, f32[{features}]{{0}}) batch-norm-training(%x, %s, %o), epsilon=0.001, feature_index=1
  ROOT %y = f32[{rows},{features}]{{1,0}} get-tuple-element(%t), index=0
}}
"""


def test_split_features_verify(tmp_path):
    assert_pair_verifies(tmp_path, pair_module(8, 6, 1), pair_module(8, 3, 2),
                         ["out0 = concat(r0.out0, r1.out0; dim 1)"])


def test_split_batch_is_not_verified_and_located(tmp_path):
    text = pair_module(4, 6, 2)
    res = verify_texts(tmp_path, pair_module(8, 6, 1), text)
    assert not res.verified
    first = res.failures[0]
    assert (first.file, first.line) == (str(tmp_path / "dist.hlo"), line_of(text, "  %t = "))
    assert "all-reduce" in first.message


@pytest.mark.parametrize("old,new,msg", [
    ("feature_index=1\n  %y", "feature_index=3\n  %y", "feature_index"),
    ("epsilon=0.001, feature_index=1\n  %y", "feature_index=1\n  %y", "epsilon"),
    ("batch-norm-inference(%x, %s, %o, %m, %v)", "batch-norm-inference(%x, %s, %o, %m)",
     "takes 5 operands"),
    ("batch-norm-grad(%x, %s, %m, %v, %dy)", "batch-norm-grad(%x, %s, %m, %v, %x2)",
     "not defined"),
    ("%g = (f32[4,3,5]{2,1,0}, f32[3]{0}, f32[3]{0})", "%g = (f32[4,3,5]{2,1,0}, f32[3]{0}, f32[3]{0}, f32[3]{0})",
     "declares the result"),
])
def test_malformed_batch_norms_name_their_line(old, new, msg):
    assert old in ALL_THREE
    text = ALL_THREE.replace(old, new, 1)
    with pytest.raises(InputError) as ei:
        lower(text)
    e = ei.value
    assert msg in e.message and e.file == "t.hlo" and "\n" not in str(e)
    assert e.line == next(i for i, ln in enumerate(text.splitlines(), 1) if new.split("\n")[0] in ln)

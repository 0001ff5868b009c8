"""The torch-neuronx custom calls AwsNeuronGelu, AwsNeuronGeluBackward,
AwsNeuronSoftmax and AwsNeuronSoftmaxBackward (dlverify/custom_calls.toml):
expanded into IR ops that compute what JAX computes for the same definitions
(torch_neuronx xla_impl/ops.py: the exact erf GELU, its derivative, softmax over
the backend_config dim, its vjp); elementwise calls and a softmax (backward)
over a dim each rank holds whole verify, one over a split dim does not and is
located at its line; malformed calls are one-line errors."""
# XLA_FLAGS (8 host devices, explicit replica groups): tests/conftest.py
import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hlo_pairs import assert_pair_verifies, verify_texts  # noqa: E402

from dlverify.errors import InputError  # noqa: E402
from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module  # noqa: E402
from dlverify.interpret import Interpreter  # noqa: E402
from dlverify.ir import IdAllocator  # noqa: E402

CALL_LINE = 5


def module(target: str, rows: int, parts: int = 1, backend_config: str | None = None,
           dtype: str = "f32") -> str:
    bc = f', backend_config="{backend_config}"' if backend_config is not None else ""
    return f"""HloModule m, num_partitions={parts}

ENTRY %main (x: {dtype}[{rows},6]) -> {dtype}[{rows},6] {{
  %x = {dtype}[{rows},6]{{1,0}} parameter(0)
  ROOT %y = {dtype}[{rows},6]{{1,0}} custom-call(%x), custom_call_target="{target}", api_version=API_VERSION_UNSPECIFIED{bc}
}}
"""


def lower(text: str):
    return hlo_to_graph(parse_hlo_module(text, "t.hlo"), IdAllocator(), "g")


def gelu(v):
    return jax.nn.gelu(v, approximate=False)


REFERENCE = {
    "AwsNeuronGelu": (None, gelu),
    "AwsNeuronGeluBackward": (None, jax.vmap(jax.vmap(jax.grad(gelu)))),
    "AwsNeuronSoftmax": ("1", lambda v: jax.nn.softmax(v, axis=1)),
}


@pytest.mark.parametrize("target", sorted(REFERENCE))
def test_expansion_computes_the_definition(target):
    cfg, fn = REFERENCE[target]
    g, info = lower(module(target, 8, backend_config=cfg))
    x = (np.random.default_rng(0).standard_normal((8, 6)) * 3).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 40.0]
    got = Interpreter(g, 1).run([[x]])[g.outputs[0]][0]
    np.testing.assert_allclose(got, np.asarray(fn(x)), rtol=2e-6, atol=1e-6)
    assert len(info.assumptions) == 1 and target in info.assumptions[0] \
        and "dlverify/custom_calls.toml" in info.assumptions[0]
    assert info.custom_calls == {target: 1}


def test_softmax_dim_from_backend_config_and_errors():
    g, _ = lower(module("AwsNeuronSoftmax", 8, backend_config="-2"))
    reduce_ops = [op for op in g.ops if op.kind in ("reduce_max", "reduce_sum")]
    assert [op.params for op in reduce_ops] == [{"axes": (0,)}, {"axes": (0,)}]
    for cfg, msg in [(None, "is not the normalised dim"), ("2", "outside the rank-2 input")]:
        with pytest.raises(InputError) as ei:
            lower(module("AwsNeuronSoftmax", 8, backend_config=cfg))
        assert ei.value.line == CALL_LINE and msg in ei.value.message


def test_two_operands_are_an_error_naming_the_line():
    text = module("AwsNeuronGelu", 8).replace("custom-call(%x)", "custom-call(%x, %x)")
    with pytest.raises(InputError) as ei:
        lower(text)
    assert (ei.value.file, ei.value.line) == ("t.hlo", CALL_LINE)
    assert "registry" in ei.value.message and "\n" not in str(ei.value)


@pytest.mark.parametrize("target,cfg", [("AwsNeuronGelu", None), ("AwsNeuronGeluBackward", None),
                                        ("AwsNeuronSoftmax", "1")])
def test_rows_held_whole_verify(tmp_path, target, cfg):
    assert_pair_verifies(tmp_path, module(target, 8, backend_config=cfg),
                         module(target, 4, parts=2, backend_config=cfg),
                         ["out0 = concat(r0.out0, r1.out0; dim 0)"])


def test_softmax_over_a_split_dim_is_not_verified_and_located(tmp_path):
    res = verify_texts(tmp_path, module("AwsNeuronSoftmax", 8, backend_config="0"),
                       module("AwsNeuronSoftmax", 4, parts=2, backend_config="0"))
    assert not res.verified
    assert (res.failures[0].file, res.failures[0].line) == (str(tmp_path / "dist.hlo"), CALL_LINE)


def test_cli_unknown_neuron_target_exit_2(tmp_path):
    from typer.testing import CliRunner

    from dlverify.cli import app
    path = tmp_path / "m.hlo"
    path.write_text(module("AwsNeuronNotARealTarget", 8))
    r = CliRunner().invoke(app, ["check", str(path), str(path), "--ranks", "1"])
    assert r.exit_code == 2
    assert f"{path}:{CALL_LINE}:" in r.output and "AwsNeuronNotARealTarget" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_registry_rejects_softmax_without_dim():
    from dlverify.frontends.custom_calls import parse_registry
    with pytest.raises(InputError) as ei:
        parse_registry('S = { expand = "softmax", operands = ["x"] }\n', "r.toml")
    assert ei.value.line == 1 and "softmax needs dim" in ei.value.message


# ---------------------------------------------------------------- softmax backward
BACKWARD_LINE = 6


def backward_module(rows: int, parts: int = 1, backend_config: str = "1") -> str:
    """dx = AwsNeuronSoftmaxBackward(dy, y) over f32[rows,6]."""
    t = f"f32[{rows},6]"
    return f"""HloModule m, num_partitions={parts}

ENTRY %main (dy: {t}, y: {t}) -> {t} {{
  %dy = {t}{{1,0}} parameter(0)
  %y = {t}{{1,0}} parameter(1)
  ROOT %dx = {t}{{1,0}} custom-call(%dy, %y), custom_call_target="AwsNeuronSoftmaxBackward", api_version=API_VERSION_UNSPECIFIED, backend_config="{backend_config}"
}}
"""


@pytest.mark.parametrize("cfg,axis", [("1", 1), ("-1", 1), ("0", 0), ("-2", 0)])
def test_softmax_backward_is_the_vjp_of_softmax(cfg, axis):
    g, info = lower(backward_module(8, backend_config=cfg))
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((8, 6)) * 3).astype(np.float32)
    dy = rng.standard_normal((8, 6)).astype(np.float32)
    y, vjp = jax.vjp(lambda v: jax.nn.softmax(v, axis=axis), x)
    (want,) = vjp(dy)
    y = np.asarray(y)
    got = Interpreter(g, 1).run([[dy], [y]])[g.outputs[0]][0]
    np.testing.assert_allclose(got, np.asarray(want), rtol=2e-5, atol=1e-6)
    assert np.abs(np.asarray(want)).max() > 1e-2   # a gradient that is not all zeros
    assert info.assumptions == [
        (f"custom call AwsNeuronSoftmaxBackward assumed to compute the softmax gradient "
         f"y * (dy - sum(dy * y)) over dim {axis} of (grad_output, output) = (dy, y) "
         f"(dlverify/custom_calls.toml)")]
    assert info.custom_calls == {"AwsNeuronSoftmaxBackward": 1}


def test_softmax_backward_rows_held_whole_verify(tmp_path):
    assert_pair_verifies(tmp_path, backward_module(8), backward_module(4, parts=2),
                         ["out0 = concat(r0.out0, r1.out0; dim 0)"])


def test_softmax_backward_over_a_split_dim_is_not_verified_and_located(tmp_path):
    res = verify_texts(tmp_path, backward_module(8, backend_config="0"),
                       backward_module(4, parts=2, backend_config="0"))
    assert not res.verified
    assert (res.failures[0].file, res.failures[0].line) == (str(tmp_path / "dist.hlo"),
                                                            BACKWARD_LINE)


def test_softmax_backward_malformed_calls_are_one_line_errors():
    one_operand = backward_module(8).replace("custom-call(%dy, %y)", "custom-call(%dy)")
    with pytest.raises(InputError) as ei:
        lower(one_operand)
    assert ei.value.line == BACKWARD_LINE and "registry" in ei.value.message
    with pytest.raises(InputError) as ei:
        lower(backward_module(8, backend_config="2"))
    assert ei.value.line == BACKWARD_LINE and "outside the rank-2 input" in ei.value.message
    from dlverify.frontends.custom_calls import parse_registry
    with pytest.raises(InputError) as ei:
        parse_registry('B = { expand = "softmax_backward", operands = ["dy"], dim = 0 }\n', "r.toml")
    assert ei.value.line == 1 and "softmax_backward takes 2 operands" in ei.value.message

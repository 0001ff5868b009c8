"""The TOML relation spec and the Problem built from a pair of HLO modules."""
# XLA_FLAGS (8 host devices, explicit replica groups): tests/conftest.py
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dlverify.errors import InputError  # noqa: E402
from dlverify.interpret import Interpreter  # noqa: E402
from dlverify.ir import IdAllocator, Mesh  # noqa: E402
from dlverify.hlo_api import hlo_problem  # noqa: E402
from dlverify.spec import OutputSpec, ParamSpec, load_spec, parse_spec  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "neuron_llama"
TP1, TP2 = DATA / "tp1_layer1.hlo", DATA / "tp2_layer1.hlo"


def spec_err(text: str) -> InputError:
    with pytest.raises(InputError) as ei:
        parse_spec(text, "s.toml")
    assert ei.value.file == "s.toml" and "\n" not in str(ei.value)
    return ei.value


# ---------------------------------------------------------------------------
# Loading


def test_load_neuron_spec():
    spec = load_spec(DATA / "tp2.toml")
    assert spec.ranks == 2
    assert sorted(spec.params) == list(range(17))
    assert spec.params[0] == ParamSpec("replicated", line=spec.params[0].line)
    assert spec.params[9].kind == "split" and spec.params[9].dim == 1
    assert spec.params[9].segments == (2048, 512, 512)
    assert spec.params[6].dim == 2 and spec.params[6].segments is None
    assert spec.outputs == {0: OutputSpec("concat", 0, spec.outputs[0].line),
                            1: OutputSpec("concat", 2, spec.outputs[1].line),
                            2: OutputSpec("concat", 2, spec.outputs[2].line)}
    lines = (DATA / "tp2.toml").read_text().splitlines()
    assert lines[spec.params[9].line - 1].startswith("9 = { split = 1, segments")


def test_spec_example_from_the_docs():
    spec = parse_spec('ranks = 2\n[params]\n0 = "replicated"\n'
                      '9 = { split = 1, segments = [2048, 512, 512] }\n10 = { split = 1 }\n'
                      '[outputs]\n0 = { concat = 0 }\n', "s.toml")
    assert spec.params[10] == ParamSpec("split", 1, None, 5)
    assert spec.outputs[0] == OutputSpec("concat", 0, 7)
    assert parse_spec("[params]\n", "s.toml").outputs is None


def test_spec_errors_have_lines():
    e = spec_err("ranks = 2\n[params]\n0 = { split = 1\n")
    assert e.line == 3 and "TOML" in e.message
    e = spec_err("ranks = 2\n[params]\n0 = \"sharded\"\n")
    assert e.line == 3 and "parameter 0" in e.message
    e = spec_err("ranks = 2\n[params]\n0 = \"replicated\"\nx = \"replicated\"\n")
    assert e.line == 4 and "'x'" in e.message
    e = spec_err("ranks = 0\n")
    assert e.line == 1
    e = spec_err("ranks = 2\n[params]\n1 = { split = 1, segments = [0, 4] }\n")
    assert e.line == 3 and "segments" in e.message
    e = spec_err("ranks = 2\n[params]\n1 = { split = 1, chunks = 3 }\n")
    assert e.line == 3
    e = spec_err("ranks = 2\n[outputs]\n0 = { concat = -1 }\n")
    assert e.line == 3 and "output 0" in e.message
    e = spec_err("rank = 2\n")
    assert e.line == 1 and "rank" in e.message
    with pytest.raises(InputError) as ei:
        load_spec(DATA / "missing.toml")
    assert "cannot read" in ei.value.message


# ---------------------------------------------------------------------------
# Problems from the Neuron pairs


def test_neuron_problem_with_spec():
    p = hlo_problem(TP1, TP2, load_spec(DATA / "tp2.toml"), None, IdAllocator())
    assert p.mesh == Mesh(("_flat",), (2,))
    # 17 parameters, the fused QKV (p9) split into 3 segment inputs in both graphs.
    assert len(p.inputs) == len(p.seq.inputs) == len(p.dist.inputs) == 19
    assert p.seq.input_names[9:12] == ["param9.seg0", "param9.seg1", "param9.seg2"]
    assert p.dist.input_names == p.seq.input_names
    q, k, v = p.inputs[9:12]
    assert (q.seq_shape, q.dist_shape, q.offsets) == ((2048, 2048), (2048, 1024), ((0, 0), (0, 1024)))
    assert (k.seq_shape, k.dist_shape, k.offsets) == ((2048, 512), (2048, 256), ((0, 0), (0, 256)))
    assert (v.seq_shape, v.dist_shape) == ((2048, 512), (2048, 256))
    for g, width in ((p.seq, 3072), (p.dist, 1536)):
        cat = g.ops[0]
        assert cat.kind == "concatenate" and cat.params == {"dimension": 1}
        assert cat.inputs == g.inputs[9:12]
        assert g.tensors[cat.output].shape == (2048, width)
        assert cat.output not in g.inputs
        assert cat.loc.line > 0
    kv = p.inputs[6]
    assert kv.seq_shape == (64, 4, 8, 64) and kv.offsets == ((0, 0, 0, 0), (0, 0, 4, 0))
    assert p.inputs[0].is_replicated() and p.inputs[8].is_replicated()
    head = p.inputs[18]
    assert head.seq_shape == (2048, 128256) and head.offsets[1] == (0, 64128)
    assert [o.seq_shape for o in p.outputs] == [(128256, 1, 4), (64, 4, 8, 64), (64, 4, 8, 64)]
    assert p.outputs[0].offsets == ((0, 0, 0), (64128, 0, 0))
    assert p.outputs[1].offsets == ((0, 0, 0, 0), (0, 0, 4, 0))
    # Only the custom calls are assumed: the spec names every parameter.
    assert p.assumptions == [
        "custom call AwsNeuronTransferWithStaticRing assumed to be the identity "
        "(dlverify/custom_calls.toml)",
        "custom call AwsNeuronRmsNorm assumed to compute rms_norm(input, weight, epsilon) over "
        "dim 0 (dlverify/custom_calls.toml)"]


def test_neuron_layer2_problem_with_spec():
    p = hlo_problem(DATA / "tp1_layer2.hlo", DATA / "tp2_layer2.hlo",
                    load_spec(DATA / "tp2_layer2.toml"), None, IdAllocator())
    assert len(p.inputs) == 26 + 4
    segs = [n for n in p.seq.input_names if ".seg" in n]
    assert segs == [f"param{k}.seg{i}" for k in (11, 18) for i in range(3)]
    assert len(p.outputs) == 5 and all(o is not None for o in p.outputs)


def _prune(graph, outs):
    need, keep = set(outs), []
    for op in reversed(graph.ops):
        if op.output in need:
            keep.append(op)
            need.update(op.inputs)
    graph.ops = list(reversed(keep))
    graph.outputs = list(outs)


def _block(a, rel, r):
    return a[tuple(slice(o, o + s) for o, s in zip(rel.offsets[r], rel.dist_shape))]


def _longest_accumulation(graph) -> int:
    """The most terms any one output element of a dot or a sum reduction adds up."""
    longest = 1
    for op in graph.ops:
        shape = graph.tensors[op.inputs[0]].shape if op.inputs else ()
        if op.kind == "dot_general":
            dims = op.params["lhs_contract"]
        elif op.kind == "reduce_sum":
            dims = op.params["axes"]
        else:
            continue
        longest = max(longest, int(np.prod([shape[d] for d in dims])))
    return longest


def rounding_tolerance(dtype, reference: np.ndarray, terms: int) -> dict:
    """assert_allclose tolerances for two evaluations of one real function that
    differ only in rounding (the distributed program adds partial sums in
    another order), computed in `dtype`: the rounding error of a sum of `terms`
    products grows like sqrt(terms) ulps of the values' scale (random signs),
    so allow 2 * sqrt(terms) ulps of the largest reference magnitude. A wrong
    block or a missing reduction differs by the scale itself, far above this."""
    ulps = 2.0 * np.sqrt(terms) * float(np.finfo(dtype).eps)
    scale = float(np.max(np.abs(reference))) if reference.size else 0.0
    return {"rtol": ulps, "atol": ulps * scale}


def test_neuron_kv_cache_outputs_agree_numerically():
    """Run both translated programs (the KV-cache outputs, which need the
    RMSNorm, the segmented QKV weight and the rotary embedding) on random
    inputs: every rank's output is its block of the sequential output."""
    p = hlo_problem(TP1, TP2, load_spec(DATA / "tp2.toml"), None, IdAllocator())
    rng = np.random.default_rng(0)
    inv_freq = rng.random(32).astype(np.float32)   # the elided constant, same in both
    for g in (p.seq, p.dist):
        for op in g.ops:
            if op.kind == "constant" and op.params["value"] is None:
                op.params["value"] = inv_freq
        _prune(g, g.outputs[1:3])
    seq_in, dist_in = [], []
    used = {i for op in p.seq.ops for i in op.inputs}
    for t, rel in zip(p.seq.inputs, p.inputs):
        tensor = p.seq.tensors[t]
        if t not in used:   # e.g. the LM head: a zero-size-in-memory stand-in
            a = np.broadcast_to(np.float32(0), tensor.shape)
        elif tensor.dtype.startswith("int"):
            a = rng.integers(0, 4, size=tensor.shape)
        else:
            a = rng.standard_normal(tensor.shape).astype(np.float32) * 0.1
        seq_in.append([a])
        dist_in.append([_block(a, rel, r) for r in range(2)])
    vs = Interpreter(p.seq, 1).run(seq_in)
    vd = Interpreter(p.dist, 2, axis_coords=lambda r, axis: r).run(dist_in)
    # Both programs compute in float32 (the inputs' type); the KV projections
    # contract over the hidden size.
    terms = _longest_accumulation(p.seq)
    assert terms >= 2048
    for i, rel in enumerate(p.outputs[1:3]):
        full = vs[p.seq.outputs[i]][0]
        tol = rounding_tolerance(np.float32, full, terms)
        assert tol["atol"] < 1e-3 * float(np.max(np.abs(full)))   # still a tight check
        for r in range(2):
            np.testing.assert_allclose(vd[p.dist.outputs[i]][r], _block(full, rel, r), **tol)
        # The tolerance still tells the ranks' blocks apart.
        assert not np.allclose(vd[p.dist.outputs[i]][0], _block(full, rel, 1), **tol)


def test_inferred_relations_are_assumptions():
    p = hlo_problem(TP1, TP2, None, 2, IdAllocator())
    # the fused QKV weight (parameter 9) becomes three segment inputs
    assert len(p.inputs) == 19 and p.outputs == [None, None, None]
    inferred = [a for a in p.assumptions if a.startswith("parameter ")]
    assert len(inferred) == 17
    assert inferred[0] == ("parameter 0 (p0.1, sequential float16[2048,64,4], distributed "
                           "float16[2048,64,4]): replicated (same shape in both programs)")
    assert inferred[9].startswith("parameter 9 (p9.10, sequential float16[2048,3072], distributed "
                                  "float16[2048,1536]): segments [2048, 512, 512] of dim 1, each "
                                  "split evenly over 2 ranks, rank order: the sequential program "
                                  "cuts dim 1 of its products at [2048, 2560]")
    assert inferred[10] == ("parameter 10 (p10.11, sequential float16[2048,2048], distributed "
                            "float16[2048,1024]): split evenly along dim 1 over 2 ranks, rank "
                            "order (inferred from the shapes)")
    assert p.inputs[6].offsets[1] == (0, 0, 4, 0)
    assert [r.dist_shape for r in p.inputs[9:12]] == [(2048, 1024), (2048, 256), (2048, 256)]


def test_partial_spec_infers_the_rest(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text("[params]\n9 = { split = 1, segments = [2048, 512, 512] }\n")
    p = hlo_problem(TP1, TP2, load_spec(f), 2, IdAllocator())
    assert len(p.inputs) == 19
    inferred = [a for a in p.assumptions if a.startswith("parameter ")]
    assert len(inferred) == 16 and not any(a.startswith("parameter 9 ") for a in inferred)


def write_spec(tmp_path, text):
    f = tmp_path / "s.toml"
    f.write_text(text)
    return load_spec(f)


def problem_err(tmp_path, text, ranks=None) -> InputError:
    spec = write_spec(tmp_path, text)
    with pytest.raises(InputError) as ei:
        hlo_problem(TP1, TP2, spec, ranks, IdAllocator())
    assert "\n" not in str(ei.value)
    return ei.value


def test_wrong_spec_is_an_input_error(tmp_path):
    e = problem_err(tmp_path, "ranks = 2\n[params]\n9 = { split = 0 }\n")
    assert e.file.endswith("s.toml") and e.line == 3
    assert "parameter 9" in e.message and "local shape" in e.message
    e = problem_err(tmp_path, "ranks = 2\n[params]\n9 = { split = 1, segments = [2048, 512] }\n")
    assert e.line == 3 and "sum to 2560" in e.message
    e = problem_err(tmp_path, "ranks = 2\n[params]\n0 = { split = 0 }\n")
    assert e.line == 3 and "parameter 0" in e.message
    e = problem_err(tmp_path, "ranks = 2\n[params]\n16 = \"replicated\"\n")
    assert e.line == 3 and "differs" in e.message
    e = problem_err(tmp_path, "ranks = 2\n[params]\n17 = \"replicated\"\n")
    assert e.line == 3 and "17 parameters" in e.message
    e = problem_err(tmp_path, "ranks = 2\n[params]\n9 = { split = 5 }\n")
    assert e.line == 3 and "outside" in e.message
    e = problem_err(tmp_path, "ranks = 2\n[outputs]\n0 = { concat = 1 }\n")
    assert e.line == 3 and "output 0" in e.message
    e = problem_err(tmp_path, "ranks = 2\n[outputs]\n3 = \"replicated\"\n")
    assert e.line == 3 and "3 arrays" in e.message
    e = problem_err(tmp_path, "ranks = 4\n")
    assert "parameter 6" in e.message and e.file == str(TP2)   # cannot infer over 4 ranks


def test_ranks_must_be_known(tmp_path):
    # the collectives name no rank (`{}` is every rank) and the header declares none
    dist = tmp_path / "no_groups.hlo"
    dist.write_text(TP2.read_text().replace("replica_groups={{0,1}}", "replica_groups={}"))
    with pytest.raises(InputError) as ei:
        hlo_problem(TP1, dist, None, None, IdAllocator())
    assert "--ranks" in ei.value.message and "collectives name no rank" in ei.value.message


def test_ranks_from_the_replica_groups():
    p = hlo_problem(TP1, TP2, None, None, IdAllocator())
    assert p.mesh.size == 2
    assert any(a.startswith("2 ranks from the replica groups of all-reduce at tp2_layer1.hlo:")
               for a in p.assumptions)


def test_parameter_count_mismatch():
    # 26 sequential parameters against 17: the 17 pair by shapes and uses, the
    # other 9 are unread stand-ins, and the output counts then disagree
    with pytest.raises(InputError) as ei:
        hlo_problem(DATA / "tp1_layer2.hlo", TP2, None, 2, IdAllocator())
    assert "returns 5 arrays but the distributed one returns 3" in ei.value.message


# ---------------------------------------------------------------------------
# A pair generated with JAX


def test_jax_pair_problem(tmp_path):
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh as JMesh
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def mlp(x, w1, w2):
        return jnp.tanh(x @ w1) @ w2

    rng = np.random.default_rng(0)
    args = (rng.standard_normal((8, 16)).astype(np.float32),
            rng.standard_normal((16, 32)).astype(np.float32),
            rng.standard_normal((32, 16)).astype(np.float32))
    mesh = JMesh(np.array(jax.devices()[:2]), ("tp",))
    shard = tuple(NamedSharding(mesh, s) for s in (P(), P(None, "tp"), P("tp", None)))
    seq_f, dist_f = tmp_path / "seq.hlo", tmp_path / "dist.hlo"
    seq_f.write_text(jax.jit(mlp).lower(*args).as_text(dialect="hlo"))
    dist_f.write_text(jax.jit(mlp, in_shardings=shard, out_shardings=NamedSharding(mesh, P()))
                      .lower(*args).compile().as_text())
    p = hlo_problem(seq_f, dist_f, None, None, IdAllocator())   # ranks from num_partitions
    assert p.mesh == Mesh(("_flat",), (2,))
    assert p.inputs[1].offsets == ((0, 0), (0, 16)) and p.inputs[2].offsets == ((0, 0), (16, 0))
    assert all("sharding annotation" in a for a in p.assumptions)
    assert [op.kind for op in p.dist.ops if op.kind == "all_reduce"] == ["all_reduce"]
    vs = Interpreter(p.seq, 1).run([[a] for a in args])
    vd = Interpreter(p.dist, 2, axis_coords=lambda r, axis: r).run(
        [[_block(a, rel, r) for r in range(2)] for a, rel in zip(args, p.inputs)])
    for r in range(2):
        np.testing.assert_allclose(vd[p.dist.outputs[0]][r], vs[p.seq.outputs[0]][0], rtol=1e-4,
                                   atol=1e-4)
    with pytest.raises(InputError) as ei:
        hlo_problem(seq_f, dist_f, None, 4, IdAllocator())
    assert "num_partitions" in ei.value.message


# ---------------------------------------------------------------------------
# pair_modules: the one pairing of two HLO modules (files, dumps, jax.jit)

PAIR_SEQ = """HloModule s

ENTRY %main (a: f32[8,4], b: f32[4], c: f32[2]) -> f32[8,4] {
  %a = f32[8,4]{1,0} parameter(0)
  %b = f32[4]{0} parameter(1)
  %c = f32[2]{0} parameter(2)
  %bb = f32[8,4]{1,0} broadcast(%b), dimensions={1}
  ROOT %r = f32[8,4]{1,0} add(%a, %bb)
}
"""
PAIR_DIST = """HloModule d, num_partitions=2

ENTRY %main_spmd (a: f32[4,4], b: f32[4]) -> f32[4,4] {
  %a = f32[4,4]{1,0} parameter(0), sharding={devices=[2,1]<=[2]}
  %b = f32[4]{0} parameter(1)
  %bb = f32[4,4]{1,0} broadcast(%b), dimensions={1}
  ROOT %r = f32[4,4]{1,0} add(%a, %bb)
}
"""


def test_pair_modules_maps_kept_arguments_and_stands_in_for_dropped_ones():
    from dlverify.frontends.hlo import parse_hlo_module
    from dlverify.frontends.hlo.pairing import ParamPolicy, pair_modules

    seq, dist = parse_hlo_module(PAIR_SEQ, "s.hlo"), parse_hlo_module(PAIR_DIST, "d.hlo")
    strict = ParamPolicy(infer_from_shapes=False, sharding_is_assumption=False)
    # Parameter b carries no sharding: under the jax.jit policy that is an error...
    with pytest.raises(InputError, match="does not give each device an even block") as ei:
        pair_modules(seq, dist, IdAllocator(), ranks=2, dist_args=[0, 1], policy=strict)
    assert ei.value.file == "d.hlo" and ei.value.line == 5
    # ... and inferred from the shapes (an assumption, listed) for HLO files.
    p = pair_modules(seq, dist, IdAllocator(), ranks=2, dist_args=[0, 1],
                     input_names=["x", "y", "z"])
    assert p.inputs[0].offsets == ((0, 0), (4, 0))          # from sharding={devices=[2,1]<=[2]}
    assert p.inputs[1].is_replicated() and p.inputs[2].is_replicated()
    assert any("parameter 1" in a and "same shape" in a for a in p.assumptions)
    assert any("parameter 0" in a and "sharding annotation" in a for a in p.assumptions)
    # c, dropped by the distributed program, gets a stand-in input nothing reads.
    stand_in = p.dist.inputs[2]
    assert p.dist.tensors[stand_in].shape == (2,)
    assert not any(stand_in in op.inputs for op in p.dist.ops)
    assert p.seq.input_names == p.dist.input_names == ["x", "y", "z"]
    # Without dist_args the counts differ, so parameters pair by shapes and uses;
    # c has no counterpart (a stand-in, listed as an assumption).
    p = pair_modules(seq, dist, IdAllocator(), ranks=2)
    assert p.inputs[0].offsets == ((0, 0), (4, 0)) and p.inputs[1].is_replicated()
    assert "parameter 2 (c) has no distributed counterpart: the distributed program does not " \
           "read it" in p.assumptions
    assert any(a.startswith("parameter 1 (b) paired with distributed parameter 1 (b): "
                            "compatible shapes, same uses, same number") for a in p.assumptions)

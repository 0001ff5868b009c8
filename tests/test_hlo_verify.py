"""End to end over HLO: the Neuron Llama pairs, the hand-made mutants, JAX
programs partitioned by `jax.jit` shardings (MLP and a 2-layer transformer,
forward and backward, 1-D and 2x2 meshes), XLA dump folders, and output
relations inferred from the views. Every view derived for a JAX program is
checked numerically on random inputs."""
# XLA_FLAGS (8 host devices, explicit replica groups): tests/conftest.py
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402
from rulekit import assert_views_hold  # noqa: E402

import jax_models as M  # noqa: E402
from hlo_pairs import verify_texts  # noqa: E402
import dlverify  # noqa: E402
from dlverify.errors import InputError  # noqa: E402
from dlverify.frontends.jax_compiled import DUMP_OPTIONS  # noqa: E402
from dlverify.api import verify_problem  # noqa: E402
from dlverify.hlo_api import (dump_modules, hlo_problem, relate_elided_constants, verify_dump,  # noqa: E402
                              verify_hlo)
from dlverify.ir import IdAllocator, Mesh  # noqa: E402
from dlverify.numeric import partial_sum_errors, run_both, view_error  # noqa: E402
from dlverify.outputs import infer_output_relation  # noqa: E402
from dlverify.relations import BlockRelation, replicated  # noqa: E402
from dlverify.reports.text import pair_text  # noqa: E402
from dlverify.spec import load_spec  # noqa: E402
from dlverify.verdict import ViewFact  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
NEURON = DATA / "neuron_llama"
MUT = DATA / "mutants"
ELIDED = "constant %{} elided in both files; assumed equal"


# ---------------------------------------------------------------- Neuron

def test_neuron_layer1_verifies_with_the_readme_relations():
    res = verify_hlo(NEURON / "tp1_layer1.hlo", NEURON / "tp2_layer1.hlo", NEURON / "tp2.toml")
    assert res.verified, res.failures[:2]
    assert res.outputs == ["out0 = concat(r0.out0, r1.out0; dim 0)",
                           "out1 = concat(r0.out1, r1.out1; dim 2)",
                           "out2 = concat(r0.out2, r1.out2; dim 2)"]
    assert ELIDED.format("constant.22") in res.assumptions
    assert any("AwsNeuronRmsNorm" in a for a in res.assumptions)
    assert any("AwsNeuronTransferWithStaticRing" in a for a in res.assumptions)


def test_neuron_layer2_verifies():
    res = verify_hlo(NEURON / "tp1_layer2.hlo", NEURON / "tp2_layer2.hlo", NEURON / "tp2_layer2.toml")
    assert res.verified, res.failures[:2]
    assert res.outputs[0] == "out0 = concat(r0.out0, r1.out0; dim 0)"
    assert res.outputs[1:] == [f"out{i} = concat(r0.out{i}, r1.out{i}; dim 2)" for i in range(1, 5)]
    assert ELIDED.format("constant.31") in res.assumptions


def test_neuron_outputs_inferred_without_an_outputs_table(tmp_path):
    text = (NEURON / "tp2.toml").read_text()
    spec = tmp_path / "no_outputs.toml"
    spec.write_text(text[:text.index("[outputs]")])
    res = verify_hlo(NEURON / "tp1_layer1.hlo", NEURON / "tp2_layer1.hlo", spec)
    assert res.verified
    assert res.outputs[0] == "out0 = concat(r0.out0, r1.out0; dim 0)"
    assert "output relation inferred: out2 = concat(r0.out2, r1.out2; dim 2)" in res.assumptions


def test_neuron_with_a_plain_even_split_of_the_fused_weight_is_not_verified(tmp_path):
    # stated as one even split along dim 1, the fused QKV weight's relation is
    # wrong (rank 0 would hold all of Q and half of K): nothing may be proved
    spec = tmp_path / "even.toml"
    spec.write_text("ranks = 2\n[params]\n9 = { split = 1 }\n")
    res = verify_hlo(NEURON / "tp1_layer1.hlo", NEURON / "tp2_layer1.hlo", spec)
    assert not res.verified


def test_neuron_segments_inferred_without_a_spec():
    # no spec, no --ranks: the rank count comes from the replica groups, the fused
    # QKV weight's segments from the sequential program's slices of its product;
    # both are listed as assumptions with their evidence
    res = verify_hlo(NEURON / "tp1_layer1.hlo", NEURON / "tp2_layer1.hlo")
    assert res.verified
    seg = [a for a in res.assumptions if a.startswith("parameter 9 ")]
    assert len(seg) == 1 and "segments [2048, 512, 512] of dim 1" in seg[0]
    assert "cuts dim 1 of its products at [2048, 2560]" in seg[0]
    assert "its local products at [1024, 1280]" in seg[0]
    assert any(a.startswith("2 ranks from the replica groups of all-reduce") for a in res.assumptions)


def test_elided_constants_with_different_names_stay_unknown(tmp_path):
    dist = tmp_path / "tp2.hlo"
    dist.write_text((NEURON / "tp2_layer1.hlo").read_text().replace("constant.22", "constant.922"))
    res = verify_hlo(NEURON / "tp1_layer1.hlo", dist, NEURON / "tp2.toml")
    assert not res.verified
    assert not any("elided" in a for a in res.assumptions)
    # the K and V caches do not need the rotary constant for V: V still verifies
    assert res.outputs[2] == "out2 = concat(r0.out2, r1.out2; dim 2)"
    # the report names each constant left unknown, in each file, at its line
    unknown = [n for n in res.unknowns if "has no elided twin" in n]
    assert len(unknown) == 2, res.unknowns
    assert any(n.startswith("constant %constant.922 (tp2.hlo:") and "distributed file" in n
               for n in unknown)
    assert any(n.startswith("constant %constant.22 (tp1_layer1.hlo:") and "sequential file" in n
               for n in unknown)
    # ... in the failing verdict's text, not only under --verbose
    text = pair_text("pair", res, 0.0)
    assert sum(line.startswith("  unknown: constant %constant") for line in text) == 2, text


def _cut_before_the_lm_head(p) -> None:
    """Output 0 becomes the normalised last token (the LM head's other operand), and
    what only the LM head needed (the 2048 x 128256 weight) is dropped: small enough
    to run both programs on random data."""
    for g in (p.seq, p.dist):
        prod = g.producer()
        op = prod[g.outputs[0]]
        while op.kind != "dot_general":
            op = prod[op.inputs[0]]
        g.outputs[0] = op.inputs[1]
        need, keep = set(g.outputs), []
        for op in reversed(g.ops):
            if op.output in need:
                keep.append(op)
                need.update(op.inputs)
        g.ops = keep[::-1]
    p.outputs[0] = replicated(p.seq.tensors[p.seq.outputs[0]].shape, p.mesh.size)
    read = {t for g in (p.seq, p.dist) for op in g.ops for t in op.inputs}
    used = [i for i, (s, d) in enumerate(zip(p.seq.inputs, p.dist.inputs)) if s in read or d in read]
    for g in (p.seq, p.dist):
        g.inputs = [g.inputs[i] for i in used]
        g.input_names = [g.input_names[i] for i in used]
    p.inputs = [p.inputs[i] for i in used]


def test_neuron_views_hold_numerically_up_to_the_lm_head():
    """Every view derived for the real layer (attention with GQA and rotary, the
    softmax, the MLP, the RMSNorms, the gather of the last token, the fused QKV
    rewrite) holds on random data, and every tiling set of partial sums adds up."""
    p = hlo_problem(NEURON / "tp1_layer1.hlo", NEURON / "tp2_layer1.hlo",
                    load_spec(NEURON / "tp2.toml"), None, IdAllocator())
    relate_elided_constants(p)
    _cut_before_the_lm_head(p)
    res = verify_problem(p)
    assert res.verified
    run = run_both(p, 0)
    for v in res.views:
        if v.partial is None:
            d = run.dist[v.dist][v.rank]
            assert view_error(run, p, v) <= 1e-9 * max(1.0, float(np.max(np.abs(d)))), v
    sums = partial_sum_errors(run, p, res.views)
    assert sums
    for key, err in sums:
        s = run.seq[key[0]][0]
        assert err <= 1e-9 * max(1.0, float(np.max(np.abs(s)))), key


# ---------------------------------------------------------------- mutants

def lines_of(path: Path, text: str) -> int:
    (n,) = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    return n


@pytest.mark.parametrize("mutant, marker, line", [
    ("tp2_layer1_wrong_slice.hlo", "slice={[0:256], [256:1280]}", 69),
    ("tp2_layer1_wrong_group.hlo", "replica_groups={{0},{1}}", 133),
    # the published bug's class: K's slice reads Q's columns, a valid block of the
    # fused product, so the first op without a relation comes 14 lines later;
    # found by its counterpart (dlverify/correspondence.py)
    ("tp2_layer1_k_reads_q.hlo", "%slice.54 = f16[256,256]{1,0} slice(%dot.52), slice={[0:256], [0:256]}", 89),
])
def test_neuron_mutant_located_at_the_mutated_instruction(mutant, marker, line):
    path = MUT / mutant
    assert lines_of(path, marker) == line
    res = verify_hlo(NEURON / "tp1_layer1.hlo", path, NEURON / "tp2.toml")
    assert not res.verified
    first = res.failures[0]
    assert (first.file, first.line) == (str(path), line)
    # the Python stack of the instruction's metadata follows the instruction
    assert first.frames[1].file.endswith("transformers_neuronx/hlo.py")
    assert first.frames[-1].file.endswith("test.py") and first.frames[-1].line == 46


def test_neuron_dropped_all_reduce_names_the_add_that_uses_the_partial_sum():
    path = MUT / "tp2_layer1_no_allreduce.hlo"
    line = lines_of(path, "add(%reshape.145, %add.133)")
    assert line == 155 and "all-reduce.146 =" not in path.read_text()
    res = verify_hlo(NEURON / "tp1_layer1.hlo", path, NEURON / "tp2.toml")
    assert not res.verified
    first = res.failures[0]
    assert first.kind == "unreduced-partial"
    assert f"before add at tp2_layer1_no_allreduce.hlo:{line} uses it" in first.message
    assert first.file == str(path) and "dot.143" == first.frames[0].function


def test_jax_pair_and_its_all_gather_mutant():
    seq = MUT / "jax_flatten_seq.hlo"
    ok = verify_hlo(seq, MUT / "jax_flatten_dist.hlo")
    assert ok.verified and ok.outputs == ["out0 = r0.out0  (replicated on all 2 ranks)"]
    path = MUT / "jax_flatten_wrong_gather_dim.hlo"
    line = lines_of(path, "dimensions={0}")
    res = verify_hlo(seq, path)
    assert not res.verified
    first = res.failures[0]
    assert (first.op, first.file, first.line, first.kind) == ("all_gather", str(path), line,
                                                               "not-adjacent")
    # then the user's frame of the metadata
    assert first.frames[1].file.endswith("make_jax_pair.py") and first.frames[1].function == "f"


# ---------------------------------------------------------------- JAX jit shardings

def check(seq_fn, dist_fn, *args, expect_outputs=None):
    res = dlverify.verify_jax(seq_fn, dist_fn, *args)
    assert res.verified, [f.message for f in res.failures[:3]]
    assert_views_hold(res.problem, res.views, seeds=(0,))
    if expect_outputs is not None:
        assert res.outputs == expect_outputs
    return res


def test_jit_mlp_2x2_forward():
    res = check(M.mlp, M.mlp_jit(M.mesh()), *M.mlp_args(),
                expect_outputs=["out0 = concat(r0.out0, r2.out0; dim 0)  (each block held by 2 ranks)"])
    assert res.problem.mesh.size == 4
    assert any(op.kind == "all_reduce" and op.params["groups"] == [[0, 1], [2, 3]]
               for op in res.problem.dist.ops)


def test_jit_mlp_2x2_backward():
    res = check(jax.grad(M.mlp_loss, argnums=(1, 2)), M.mlp_jit(M.mesh(), backward=True),
                *M.mlp_args())
    assert res.outputs == ["out0 = concat(r0.out0, r1.out0; dim 1)  (each block held by 2 ranks)",
                           "out1 = concat(r0.out1, r1.out1; dim 0)  (each block held by 2 ranks)"]


def test_jit_mlp_1d_mesh_forward_and_backward():
    m = M.mesh((4,), ("model",))
    specs = (P(), P(None, "model"), P("model", None))
    check(M.mlp, M.mlp_jit(m, specs=specs, out=P()), *M.mlp_args(),
          expect_outputs=["out0 = r0.out0  (replicated on all 4 ranks)"])
    check(jax.grad(M.mlp_loss, argnums=(1, 2)), M.mlp_jit(m, backward=True, specs=specs),
          *M.mlp_args())


def test_jit_transformer_2x2_forward():
    x, params = M.transformer_args()
    check(M.transformer, M.transformer_jit(M.mesh()), x, params,
          expect_outputs=["out0 = concat(r0.out0, r2.out0; dim 0)  (each block held by 2 ranks)"])


def test_jit_transformer_2x2_backward():
    x, params = M.transformer_args()
    res = check(jax.grad(M.transformer_loss, argnums=1), M.transformer_jit(M.mesh(), backward=True),
                x, params)
    # gradients flatten as [layer][sorted key]: g1, g2, w1, w2, wk, wo, wq, wv
    want = {"g1": "r0.out{i}  (replicated on all 4 ranks)",
            "g2": "r0.out{i}  (replicated on all 4 ranks)",
            "w1": "concat(r0.out{i}, r1.out{i}; dim 1)  (each block held by 2 ranks)",
            "w2": "concat(r0.out{i}, r1.out{i}; dim 0)  (each block held by 2 ranks)",
            "wk": "concat(r0.out{i}, r1.out{i}; dim 1)  (each block held by 2 ranks)",
            "wo": "concat(r0.out{i}, r1.out{i}; dim 0)  (each block held by 2 ranks)",
            "wq": "concat(r0.out{i}, r1.out{i}; dim 1)  (each block held by 2 ranks)",
            "wv": "concat(r0.out{i}, r1.out{i}; dim 1)  (each block held by 2 ranks)"}
    keys = sorted(want) * 2
    assert res.outputs == [f"out{i} = " + want[k].format(i=i) for i, k in enumerate(keys)]
    assert any(op.kind == "all_reduce" and op.params["groups"] == [[0, 2], [1, 3]]
               for op in res.problem.dist.ops)   # weight gradients summed over "data"


def test_jit_program_that_differs_is_not_verified_and_located():
    def buggy(x, w1, w2):
        return jnp.tanh(x @ w1) @ (2 * w2)   # the distributed version scales w2
    dist = jax.jit(buggy, in_shardings=M.shardings(M.mesh(), M.MLP_SPECS),
                   out_shardings=NamedSharding(M.mesh(), P("data", None)))
    res = dlverify.verify_jax(M.mlp, dist, *M.mlp_args())
    assert not res.verified
    assert any(f.file == __file__ for f in res.failures)
    assert any("scale differs by 2" in f.message for f in res.failures)


def test_jit_wrong_out_sharding_is_not_a_crash_but_a_verdict():
    # the output relation comes from out_shardings: columns here, rows in the program
    m = M.mesh()
    dist = jax.jit(M.mlp, in_shardings=M.shardings(m, M.MLP_SPECS),
                   out_shardings=NamedSharding(m, P(None, "model")))
    res = check(M.mlp, dist, *M.mlp_args())
    assert res.outputs == ["out0 = concat(r0.out0, r1.out0; dim 1)  (each block held by 2 ranks)"]


def test_jit_without_partitioning_is_an_input_error():
    with pytest.raises(InputError, match="not partitioned"):
        dlverify.verify_jax(M.mlp, jax.jit(M.mlp), *M.mlp_args())


def test_shard_map_programs_still_take_the_jaxpr_path():
    m = M.mesh((2,), ("tp",))

    def local(x, w1, w2):
        return jax.lax.psum(jnp.tanh(x @ w1) @ w2, "tp")
    dist = jax.jit(jax.shard_map(local, mesh=m, in_specs=(P(), P(None, "tp"), P("tp", None)),
                                 out_specs=P()))
    res = dlverify.verify_jax(M.mlp, dist, *M.mlp_args())
    assert res.verified and "trace" in res.timings and "compile" not in res.timings


# ---------------------------------------------------------------- dump folders

def dump(fn, *args) -> Path:
    d = Path(tempfile.mkdtemp(prefix="dlverify-test-dump-"))
    fn.lower(*args).compile(compiler_options={"xla_dump_to": str(d), **DUMP_OPTIONS})
    return d


def test_check_dump_one_verdict_per_partitioned_module():
    d = dump(M.mlp_jit(M.mesh(), backward=True), *M.mlp_args())
    try:
        jax.jit(jnp.sin).lower(np.ones(3, np.float32)).compile(
            compiler_options={"xla_dump_to": str(d)})         # one device: left out
        mods = dump_modules(d)
        assert [m.stage for m in mods] == ["after SPMD partitioning", "after optimizations"]
        out = verify_dump(d)
        assert [name.split(".", 1)[1] for name, _ in out] == ["jit_mlp_loss"]
        (_, res), = out
        assert res.verified
        assert res.outputs[1] == "out1 = concat(r0.out1, r1.out1; dim 0)  (each block held by 2 ranks)"
        assert any("relation from its sharding annotation" in a for a in res.assumptions)
    finally:
        shutil.rmtree(d)


def test_check_dump_after_optimizations_and_errors(tmp_path):
    d = dump(M.mlp_jit(M.mesh((2,), ("model",)), specs=(P(), P(None, "model"), P("model", None)),
                       out=P()), *M.mlp_args())
    try:
        for f in d.iterdir():
            if "spmd-partitioning" in f.name:
                f.unlink()
        (mod,) = dump_modules(d)
        assert mod.stage == "after optimizations" and "cpu_after_optimizations" in mod.after.name
        (_, res), = verify_dump(d)
        assert res.verified, res.failures[:2]
    finally:
        shutil.rmtree(d)
    with pytest.raises(InputError, match="no module dumped before optimisations"):
        verify_dump(tmp_path)


# ---------------------------------------------------------------- output inference

class _P:
    """A stand-in Problem for infer_output_relation: one output, shapes and a mesh."""

    def __init__(self, seq_shape, dist_shape, ranks):
        from dlverify.ir import Graph, Tensor
        self.seq, self.dist = Graph("s"), Graph("d")
        self.seq.tensors[1] = Tensor(1, seq_shape, "float32")
        self.dist.tensors[2] = Tensor(2, dist_shape, "float32")
        self.seq.outputs, self.dist.outputs = [1], [2]
        self.mesh = Mesh(("x",), (ranks,))


def view(r, offs):
    return ViewFact(1, 2, r, offs, None, (0, 0, 0, 0))


def test_inference_of_a_grid_with_copies_and_wildcards():
    p = _P((8, 6), (4, 3), 8)
    views = [view(r, (4 * (r // 4), 3 * ((r // 2) % 2))) for r in range(8)]
    rel = infer_output_relation(p, 0, views)
    assert rel == BlockRelation((8, 6), (4, 3), tuple(v.offsets for v in views))
    # a wildcard stands for whichever piece completes the grid
    views[7] = view(7, (4, -1))
    assert infer_output_relation(p, 0, views).offsets[7] in {(4, 0), (4, 3)}


def test_inference_needs_every_rank_and_the_whole_grid():
    p = _P((8, 6), (4, 3), 4)
    full = [view(0, (0, 0)), view(1, (0, 3)), view(2, (4, 0)), view(3, (4, 3))]
    assert infer_output_relation(p, 0, full) is not None
    assert infer_output_relation(p, 0, full[:3]) is None                 # rank 3 unproved
    assert infer_output_relation(p, 0, full[:3] + [view(3, (0, 0))]) is None   # a hole
    partial = ViewFact(1, 2, 3, (4, 3), None, (1, 0, 0, 0))              # 2 x the block
    assert infer_output_relation(p, 0, full[:3] + [partial]) is None
    assert infer_output_relation(_P((8,), (3,), 2), 0, [view(0, (0,)), view(1, (3,))]) is None


def test_inference_takes_blocks_in_device_order_only():
    """Whole blocks in any order would tile the output, but only an XLA iota tile
    assignment (the ranks in order, reshaped and transposed) is a layout a framework
    writes unasked: a rotation or reversal of the blocks is a bug, not a layout."""
    p = _P((16, 8), (4, 8), 4)
    order = lambda perm: [view(r, (4 * perm[r], 0)) for r in range(4)]   # noqa: E731
    assert infer_output_relation(p, 0, order([0, 1, 2, 3])).offsets == ((0, 0), (4, 0), (8, 0), (12, 0))
    # devices=[4,1]<=[2,2]T(1,0): rank 1 holds block 2 (a split over two mesh axes, transposed)
    assert infer_output_relation(p, 0, order([0, 2, 1, 3])) is not None
    assert infer_output_relation(p, 0, order([2, 3, 0, 1])) is None      # shifted by 2
    assert infer_output_relation(p, 0, order([3, 2, 1, 0])) is None      # reversed
    assert infer_output_relation(p, 0, order([1, 0, 3, 2])) is None      # pairs swapped
    # a scalar output (a loss) held whole by every rank: the grid of one piece, no dims
    scalar = _P((), (), 4)
    assert infer_output_relation(scalar, 0, [view(r, ()) for r in range(4)]).offsets == ((),) * 4


def _ring_shift(direction):
    mesh = dlverify.host_mesh((4,), ("x",))

    def local(x):
        return jax.lax.ppermute(x, "x", [(i, (i + direction) % 4) for i in range(4)])
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("x"), out_specs=P("x")))


def test_compiled_ring_shift_in_the_wrong_direction_is_not_verified(tmp_path):
    """XLA's compiled module carries no output sharding: the output relation is inferred,
    and a ppermute in the wrong direction leaves each rank a whole block, misplaced."""
    x = jax.ShapeDtypeStruct((16, 8), jnp.float32)
    seq = jax.jit(lambda x: jnp.roll(x, 4, axis=0)).lower(x).as_text(dialect="hlo")
    good = verify_texts(tmp_path, seq, _ring_shift(1).lower(x).compile().as_text())
    assert good.verified and good.outputs == ["out0 = concat(r0.out0, r1.out0, r2.out0, r3.out0; dim 0)"]
    bad = verify_texts(tmp_path, seq, _ring_shift(-1).lower(x).compile().as_text())
    assert not bad.verified
    first = bad.failures[0]
    assert first.op == "collective_permute" and first.kind == "wrong-block", first
    assert "out of device order" in first.message

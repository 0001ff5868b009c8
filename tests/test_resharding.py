"""XLA's all-to-all resharding chains rewritten as an all-gather and a slice
(dlverify/resharding.py), and FSDP training steps that need it
(tests/data/xla_resharding/, written by its make_dumps.py)."""
import copy
from pathlib import Path

import numpy as np
import pytest

from dlverify.frontends.hlo.model import FLAT_AXIS
from dlverify.api import verify_jax
from dlverify.hlo_api import verify_hlo
from dlverify.interpret import Interpreter
from dlverify.ir import Graph, GraphBuilder, IdAllocator, Mesh
from dlverify.problem import Problem
from dlverify.resharding import rewrite_reshardings, undo_round_trips

DATA = Path(__file__).parent / "data" / "xla_resharding"
GROUPS = [[0, 1, 2, 3]]


def _problem(build, x_shape, axes=(FLAT_AXIS,)):
    ids = IdAllocator()
    g = Graph("dist")
    b = GraphBuilder(g, ids)
    x = b.tensor(x_shape, "float32", "x")
    g.inputs = [x]
    g.outputs = [build(b, x)]
    mesh = Mesh(axes, (4,) if len(axes) == 1 else (2, 2))
    return Problem(Graph("seq"), g, mesh, [], [None], ids)


def _rows_to_cols(b, x, a2a_dim=1, perm=(1, 0, 2)):
    """[2, 32] split by rows over 4 ranks -> [8, 8] split by columns, as XLA writes it."""
    r = b.op("reshape", [x], (2, 4, 8), "float32")
    a = b.op("all_to_all", [r], (2, 4, 8), "float32",
             {"split_dimension": a2a_dim, "concat_dimension": a2a_dim, "groups": GROUPS})
    t = b.op("transpose", [a], tuple((2, 4, 8)[i] for i in perm), "float32", {"permutation": perm})
    return b.op("reshape", [t], (8, 8), "float32")


def _cols_to_rows(b, x):
    """[8, 8] split by columns -> [2, 32] split by rows."""
    r = b.op("reshape", [x], (4, 2, 8), "float32")
    a = b.op("all_to_all", [r], (4, 2, 8), "float32",
             {"split_dimension": 0, "concat_dimension": 0, "groups": GROUPS})
    t = b.op("transpose", [a], (2, 4, 8), "float32", {"permutation": (1, 0, 2)})
    return b.op("reshape", [t], (2, 32), "float32")


def _outputs(g, xs):
    vals = Interpreter(g, 4, lambda r, a: r).run([xs])
    return vals[g.outputs[0]]


@pytest.mark.parametrize("build,x_shape", [(_rows_to_cols, (2, 32)), (_cols_to_rows, (8, 8))])
def test_a_resharding_chain_becomes_an_all_gather_and_a_slice(build, x_shape):
    p = _problem(build, x_shape)
    before = copy.deepcopy(p.dist)
    assert rewrite_reshardings(p)
    kinds = [op.kind for op in p.dist.ops]
    assert "all_gather" in kinds and kinds[-1] == "dynamic_slice"
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(x_shape).astype(np.float32) for _ in range(4)]
    for got, want in zip(_outputs(p.dist, xs), _outputs(before, xs)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("a2a_dim,perm", [(2, (1, 0, 2)), (1, (0, 2, 1))])
def test_a_chain_no_gather_reproduces_stays(a2a_dim, perm):
    # the exchange along the 8 columns of each piece, or a transpose moving the pieces
    # after the columns: a data movement, but not the block of a gathered tensor, nor
    # one reshaped (with no transpose at all, it is: dlverify/resharding.py)
    shape = tuple((2, 4, 8)[i] for i in perm)

    def build(b, x):
        r = b.op("reshape", [x], (2, 4, 8), "float32")
        a = b.op("all_to_all", [r], (2, 4, 8), "float32",
                 {"split_dimension": a2a_dim, "concat_dimension": a2a_dim, "groups": GROUPS})
        t = b.op("transpose", [a], shape, "float32", {"permutation": perm})
        return b.op("reshape", [t], (8, 8), "float32")
    p = _problem(build, (2, 32))
    assert not rewrite_reshardings(p)
    assert "all_gather" not in [op.kind for op in p.dist.ops]


def test_only_flat_rank_programs_are_tried():
    assert not rewrite_reshardings(_problem(_rows_to_cols, (2, 32), axes=("dp", "tp")))


def test_an_fsdp_training_step_partitioned_by_xla_verifies():
    res = verify_hlo(DATA / "fsdp_mlp.seq.hlo", DATA / "fsdp_mlp.dist.hlo")
    assert res.verified, [f.message for f in res.failures[:2]]


def test_a_resharding_exchanging_the_wrong_dim_does_not_verify():
    res = verify_hlo(DATA / "fsdp_mlp.seq.hlo", DATA / "fsdp_mlp.dist_mutated.hlo")
    assert not res.verified
    # located in the corrupted chain (its reshape, all-to-all, transpose, reshape)
    text = (DATA / "fsdp_mlp.dist_mutated.hlo").read_text().splitlines()
    a2a = next(i for i, line in enumerate(text, 1) if "dimensions={2}, metadata" in line
               and "all-to-all(" in line)
    assert a2a - 1 <= res.failures[0].line <= a2a + 2, res.failures[0]


def test_a_chain_that_moves_its_operand_first_is_cut_where_the_resharding_starts():
    # XLA transposes a weight gradient [16, 64] -> [64, 16] (columns split) before
    # resharding it to rows: the transpose stays, the rest becomes a gather and a slice
    def build(b, x):
        t0 = b.op("transpose", [x], (64, 4), "float32", {"permutation": (1, 0)})
        r = b.op("reshape", [t0], (4, 16, 4), "float32")
        a = b.op("all_to_all", [r], (4, 16, 4), "float32",
                 {"split_dimension": 0, "concat_dimension": 0, "groups": GROUPS})
        t = b.op("transpose", [a], (16, 4, 4), "float32", {"permutation": (1, 0, 2)})
        return b.op("reshape", [t], (16, 16), "float32")
    p = _problem(build, (4, 64))
    before = copy.deepcopy(p.dist)
    assert rewrite_reshardings(p)
    assert [op.kind for op in p.dist.ops][0] == "transpose" and "all_gather" in \
        [op.kind for op in p.dist.ops]
    xs = [np.random.default_rng(r).standard_normal((4, 64)).astype(np.float32) for r in range(4)]
    for got, want in zip(_outputs(p.dist, xs), _outputs(before, xs)):
        np.testing.assert_array_equal(got, want)


def _jit_training_step(model: str, data_parallel_only: bool):
    """GPT-2's or Llama-3's one-layer training step jitted over 2 devices, the batch
    split; the parameters split along dim 0 where it splits (FSDP), or replicated
    (data parallelism). Returns the sequential step, the jitted one and the args."""
    import sys

    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P

    import dlverify
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "models"))
    if model == "gpt2":
        import gpt2 as M
        cfg = M.Config(layers=1)
    else:
        import llama3 as M
        cfg = M.SMALL._replace(layers=1, batch=2)
    n = len(M.param_shapes(cfg))
    args = M.args(cfg)
    mesh = dlverify.host_mesh((2,), ("dp",))

    def loss(*flat):
        p, ids, labels = M._unpack(cfg, flat)
        return M.xent(M.forward_seq(cfg, p, ids), labels, cfg.vocab)

    def step(*flat):
        value, grads = jax.value_and_grad(loss, argnums=tuple(range(n)))(*flat)
        return (value, *grads)
    specs = [P() if data_parallel_only or not a.shape or a.shape[0] % 2 else P("dp")
             for a in args[:n]]
    jitted = jax.jit(step, in_shardings=tuple(NamedSharding(mesh, s)
                                              for s in specs + [P("dp"), P("dp")]))
    return M.make_seq(cfg, True), jitted, args


def test_gpt2_training_step_jitted_with_fsdp_shardings_verifies():
    seq, jitted, args = _jit_training_step("gpt2", data_parallel_only=False)
    res = verify_jax(seq, jitted, *args)
    assert res.verified, [f.message for f in res.failures[:2]]


@pytest.mark.parametrize("model", ["gpt2", "llama3"])
def test_training_step_jitted_with_data_parallelism_verifies(model):
    # the partitioner contracts each weight gradient's heads unmerged and merges them
    # after its all-reduce (the sequential step merges first), and sums Llama-3's fused
    # QKV gradient concatenated from its Q, K and V dots: dlverify/simplify_sink.py
    seq, jitted, args = _jit_training_step(model, data_parallel_only=True)
    res = verify_jax(seq, jitted, *args)
    assert res.verified, [f.message for f in res.failures[:2]]


def test_llama3_data_parallel_step_summing_a_gradient_over_groups_of_one_is_located(tmp_path):
    # the partitioned module dumped (as `dlverify check-dump` reads it), then the fused
    # QKV weight gradient's all-reduce given groups of one rank: it sums nothing, and
    # is reported there; the module as dumped verifies
    from dlverify.frontends.jax_compiled import DUMP_OPTIONS
    from dlverify.hlo_api import verify_dump
    _, jitted, args = _jit_training_step("llama3", data_parallel_only=True)
    jitted.lower(*args).compile(compiler_options={"xla_dump_to": str(tmp_path), **DUMP_OPTIONS})
    [(_, ok)] = verify_dump(tmp_path)
    assert ok.verified, [f.message for f in ok.failures[:2]]
    (path,) = [f for f in tmp_path.iterdir() if "after_spmd-partitioning" in f.name]
    lines = path.read_text().splitlines()
    (i,) = [i for i, line in enumerate(lines) if " all-reduce(" in line and "bsd,dgjk->" in line]
    assert "replica_groups=[1,2]<=[2]" in lines[i]
    lines[i] = lines[i].replace("replica_groups=[1,2]<=[2]", "replica_groups={{0},{1}}")
    path.write_text("\n".join(lines) + "\n")
    [(_, res)] = verify_dump(tmp_path)
    assert not res.verified
    first = res.failures[0]
    assert (first.op, first.file, first.line, first.kind) == ("all_reduce", str(path), i + 1,
                                                               "wrong-group"), first


def _gathered(groups, dim):
    """_rows_to_cols, then gathered along `dim` of [8, 8] over `groups`."""
    n = len(groups[0])
    def build(b, x):
        y = _rows_to_cols(b, x)
        shape = tuple(8 * n if d == dim else 8 for d in range(2))
        return b.op("all_gather", [y], shape, "float32", {"dimension": dim, "groups": groups})
    return build


def test_a_resharding_gathered_over_its_groups_is_the_gather_of_its_source():
    # XLA's backward of a fused QKV projection reshards its cotangent from batch-split
    # to slot-split, then gathers the slots for the input gradient's dot: that dot then
    # reads the gathered batch, a concatenation of the pieces as the sequential one
    p = _problem(_gathered(GROUPS, 1), (2, 32))
    before = copy.deepcopy(p.dist)
    assert rewrite_reshardings(p)
    prod = p.dist.producer()
    end = prod[p.dist.outputs[0]]
    gather = end if end.kind == "all_gather" else prod[end.inputs[0]]
    assert gather.kind == "all_gather" and gather.inputs == p.dist.inputs
    assert "dynamic_slice" not in [op.kind for op in p.dist.ops]
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal((2, 32)).astype(np.float32) for _ in range(4)]
    for got, want in zip(_outputs(p.dist, xs), _outputs(before, xs)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("groups,dim", [([[0, 1], [2, 3]], 1), (GROUPS, 0)])
def test_a_gather_of_other_blocks_keeps_the_resharding_slice(groups, dim):
    # pairs of ranks gather their [8, 8] column blocks, or all ranks stack them as rows:
    # neither is the source's rows gathered (the proof on tags refuses it)
    p = _problem(_gathered(groups, dim), (2, 32))
    before = copy.deepcopy(p.dist)
    assert rewrite_reshardings(p)
    prod = p.dist.producer()
    end = prod[p.dist.outputs[0]]
    assert end.kind == "all_gather" and prod[end.inputs[0]].kind == "dynamic_slice"
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, 32)).astype(np.float32) for _ in range(4)]
    for got, want in zip(_outputs(p.dist, xs), _outputs(before, xs)):
        np.testing.assert_array_equal(got, want)


FSDP = [[0, 2], [1, 3]]   # the groups of the round trip below (a 2 x 2 mesh's first axis)


def _position_offset(b, step):
    """step times the rank's position in its FSDP group, as XLA reads it from a table."""
    table = b.constant(np.array([0, 0, step, step], np.int32), (4,), "int32")
    rank = b.op("axis_index", [], (), "int32", {"axis": FLAT_AXIS})
    picked = b.op("dynamic_slice", [table, rank], (1,), "int32", {"slice_sizes": (1,)})
    return b.op("reshape", [picked], (), "int32", {})


def _round_trip(summed_over=FSDP, kept_slot=0):
    """XLA's backward of a fused projection's single k slot, sharded over FSDP and
    gathered back: v = psum(x) [4, 8] as [4, 1, 8], padded to 2 slots, each member
    keeping its slot (member 1 the zeros), the slots gathered, the rows split over
    the members, the padding cut off (slot `kept_slot` kept), the rows gathered."""
    ids = IdAllocator()
    g = Graph("dist")
    b = GraphBuilder(g, ids)
    x = b.tensor((4, 8), "float32", "x")
    g.inputs = [x]
    v = b.op("all_reduce", [x], (4, 8), "float32", {"reducer": "sum", "groups": summed_over})
    k = b.op("reshape", [v], (4, 1, 8), "float32", {})
    zero = b.constant(np.float32(0), (), "float32")
    i0 = b.constant(np.int32(0), (), "int32")
    padded = b.op("pad", [k, zero], (4, 2, 8), "float32",
                  {"padding_config": ((0, 0, 0), (0, 1, 0), (0, 0, 0))})
    mine = b.op("dynamic_slice", [padded, i0, _position_offset(b, 1), i0], (4, 1, 8), "float32",
                {"slice_sizes": (4, 1, 8)})
    slots = b.op("all_gather", [mine], (4, 2, 8), "float32", {"dimension": 1, "groups": FSDP})
    rows = b.op("dynamic_slice", [slots, _position_offset(b, 2), i0, i0], (2, 2, 8), "float32",
                {"slice_sizes": (2, 2, 8)})
    kept = b.op("slice", [rows], (2, 1, 8), "float32",
                {"start_indices": (0, kept_slot, 0), "limit_indices": (2, kept_slot + 1, 8),
                 "strides": None})
    back = b.op("all_gather", [kept], (4, 1, 8), "float32", {"dimension": 0, "groups": FSDP})
    g.outputs = [b.op("neg", [back], (4, 1, 8), "float32", {})]
    return g, ids, k


def _same_outputs(before, after):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((4, 8)).astype(np.float32) for _ in range(4)]
    for got, want in zip(_outputs(after, xs), _outputs(before, xs)):
        np.testing.assert_array_equal(got, want)


def test_a_round_trip_of_a_value_every_group_member_holds_is_that_value():
    g, ids, k = _round_trip()
    before = copy.deepcopy(g)
    assert undo_round_trips(g, ids, 4)
    out = g.producer()[g.outputs[0]]
    assert out.inputs == [k]      # the negation reads the psum's reshape itself
    _same_outputs(before, g)


@pytest.mark.parametrize("summed_over,kept_slot", [(None, 0), ([[0, 1], [2, 3]], 0), (FSDP, 1)])
def test_a_round_trip_of_a_value_the_members_do_not_share_or_of_the_padding_stays(summed_over, kept_slot):
    # a value of each rank's own (a psum over groups of one), one summed over the other
    # mesh axis (it differs between the members of an FSDP group), or the padding kept
    # instead of the slot (the gathered slots are still the padded value: that round
    # trip is read as it)
    g, ids, k = _round_trip(summed_over or [[0], [1], [2], [3]], kept_slot)
    before = copy.deepcopy(g)
    assert undo_round_trips(g, ids, 4) == (kept_slot == 1)
    assert g.producer()[g.outputs[0]].inputs != [k]
    _same_outputs(before, g)

"""HLO sort, topk and the TopK custom call: JAX-written modules lower to the IR's
sort / top_k ops and compute what JAX computes (ties, signed zeros, NaN);
comparators are recognised by evaluating them on probe values; a sort along a
dim every rank holds whole verifies, one along a split dim does not and is
located at its line; unsupported comparators are one-line errors."""
# XLA_FLAGS (8 host devices, explicit replica groups): tests/conftest.py
import importlib.util  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402
from hlo_pairs import assert_pair_verifies, verify_texts  # noqa: E402
from rulekit import assert_views_hold  # noqa: E402

from dlverify.errors import UnknownOpError  # noqa: E402
from dlverify.frontends.hlo import hlo_to_graph, parse_hlo_module  # noqa: E402
from dlverify.hlo_api import verify_hlo  # noqa: E402
from dlverify.interpret import Interpreter  # noqa: E402
from dlverify.ir import IdAllocator  # noqa: E402
from dlverify.ops import evaluate  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "hlo_sort"
_spec = importlib.util.spec_from_file_location("make_sort_hlo", DATA / "make_sort_hlo.py")
gen = importlib.util.module_from_spec(_spec)
sys.modules["make_sort_hlo"] = gen
_spec.loader.exec_module(gen)

TOPK_ASSUMPTION = ("custom call TopK assumed to compute lax.top_k(input, k=3): the k largest along "
                   "the last dim, equal values by lower index (dlverify/custom_calls.toml)")


def lower(text: str, file: str = "t.hlo"):
    return hlo_to_graph(parse_hlo_module(text, file), IdAllocator(), "g")


def run(graph, *inputs):
    vals = Interpreter(graph, 1).run([[x] for x in inputs])
    return [vals[o][0] for o in graph.outputs]


def hostile_input() -> np.ndarray:
    """f32[4,8] with ties, both zeros, infinities and a NaN."""
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    x[0, :5] = 1.0
    x[1, 1:5] = [-0.0, 0.0, -0.0, 0.0]
    x[2, 2], x[2, 5] = np.inf, -np.inf
    x[3, 3] = np.nan
    return x


def same(a, b) -> bool:
    """Equal values, equal signs of zero, NaN where NaN."""
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True) and \
        np.array_equal(np.signbit(a), np.signbit(b))


# ---------------------------------------------------------------- JAX-written modules

@pytest.mark.parametrize("stage", ["pre", "post"])
@pytest.mark.parametrize("name", sorted(gen.FUNCTIONS))
def test_jax_sorts_compute_what_xla_computes(name, stage):
    path = DATA / f"{name}_{stage}.hlo"
    g, info = lower(path.read_text(), str(path))
    kinds = [op.kind for op in g.ops]
    assert ("top_k" if name == "top_k" else "sort") in kinds
    x = hostile_input()
    got = run(g, x)
    want = jax.tree.leaves(gen.FUNCTIONS[name](x))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert same(a, np.asarray(b)), (name, stage, a, b)
    # JAX's comparators order exactly like the IR (-0 == +0, NaN last): no caveat
    expected = [TOPK_ASSUMPTION] if (name, stage) == ("top_k", "post") else []
    assert info.assumptions == expected


def test_sort_ops_carry_dimension_keys_and_output():
    g, _ = lower((DATA / "lax_sort2_post.hlo").read_text())
    sorts = [op for op in g.ops if op.kind == "sort"]
    assert [op.params for op in sorts] == [{"dimension": 1, "num_keys": 1, "output": i}
                                           for i in (0, 1)]
    assert all(len(op.inputs) == 2 and op.inputs == sorts[0].inputs for op in sorts)
    g, _ = lower((DATA / "top_k_pre.hlo").read_text())
    assert [op.params for op in g.ops] == [{"axis": 1, "k": 3, "output": i} for i in (0, 1)]


def test_jit_rows_pair_verifies_and_views_hold_numerically():
    res = verify_hlo(DATA / "rows_seq.hlo", DATA / "rows_dist.hlo")
    assert res.verified, [f.message for f in res.failures[:3]]
    assert res.outputs == [f"out{i} = concat(r0.out{i}, r1.out{i}; dim 0)" for i in range(4)]
    assert_views_hold(res.problem, res.views, seeds=(0,))


# ---------------------------------------------------------------- hand-written comparators

def comparator(body: str, types: tuple[str, str]) -> str:
    """%cmp over (%x0, %y0) of operand 0 and (%x1, %y1) of operand 1, returning `body`'s ROOT."""
    names = [(f"{n}{i}", t) for i, t in enumerate(types) for n in ("x", "y")]
    head = ", ".join(f"{n}: {t}[]" for n, t in names)
    params = [f"  %{n} = {t}[] parameter({k})" for k, (n, t) in enumerate(names)]
    return f"%cmp ({head}) -> pred[] {{\n" + "\n".join(params) + f"\n{body}\n}}\n"


def sort_module(body: str, n: int = 8, dim: int = 1, parts: int = 1, t: str = "f32") -> str:
    """sort((x, iota)) of x: t[n,4] along `dim` with comparator `%cmp` (`body` over
    %x0, %y0 of x and %x1, %y1 of the iota), returning (values, indices)."""
    cmp = comparator(body, (t, "s32"))
    return f"""HloModule m, num_partitions={parts}

{cmp}
ENTRY %main (x: {t}[{n},4]) -> ({t}[{n},4], s32[{n},4]) {{
  %x = {t}[{n},4]{{1,0}} parameter(0)
  %i = s32[{n},4]{{1,0}} iota(), iota_dimension={dim}
  %s = ({t}[{n},4]{{1,0}}, s32[{n},4]{{1,0}}) sort(%x, %i), dimensions={{{dim}}}, is_stable=true, to_apply=%cmp
  %v = {t}[{n},4]{{1,0}} get-tuple-element(%s), index=0
  %k = s32[{n},4]{{1,0}} get-tuple-element(%s), index=1
  ROOT %t = ({t}[{n},4]{{1,0}}, s32[{n},4]{{1,0}}) tuple(%v, %k)
}}
"""


LT = "  ROOT %r = pred[] compare(%x0, %y0), direction=LT"
GT = "  ROOT %r = pred[] compare(%x0, %y0), direction=GT"


def sort_line(text: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("  %s = "))
NAN_NOTE = "its comparator orders NaN otherwise than the IR's sort (NaN last)"


def test_plain_lt_comparator_is_ascending_with_a_nan_assumption():
    text = sort_module(LT)
    g, info = lower(text)
    assert [op.kind for op in g.ops] == ["iota", "sort", "sort"]
    assert len(info.assumptions) == 1 and NAN_NOTE in info.assumptions[0] \
        and f"t.hlo:{sort_line(text)}" in info.assumptions[0]
    x = np.random.default_rng(1).integers(-2, 3, (8, 4)).astype(np.float32)
    v, k = run(g, x)
    np.testing.assert_array_equal(k, np.argsort(x, axis=1, kind="stable"))
    np.testing.assert_array_equal(v, np.sort(x, axis=1))


def test_total_order_comparator_without_canonicalisation_notes_signed_zeros():
    _, info = lower(sort_module(LT[:-1] + "T, type=TOTALORDER"))
    assert any("orders -0 before +0" in a for a in info.assumptions)
    assert not any("NaN" in a for a in info.assumptions)   # NaN last, as the IR


@pytest.mark.parametrize("t,np_t", [("f32", np.float32), ("s32", np.int32), ("u8", np.uint8)])
def test_descending_comparator_is_a_stable_descending_sort(t, np_t):
    g, _ = lower(sort_module(GT, t=t))
    assert [op.kind for op in g.ops] == ["iota", "neg" if t == "f32" else "not", "sort", "sort"]
    assert [op.params["output"] for op in g.ops if op.kind == "sort"] == [1, 2]
    rng = np.random.default_rng(2)
    if t == "f32":
        x = rng.integers(-2, 3, (8, 4)).astype(np_t)
    else:   # the extremes: negation would overflow, bitwise not does not
        info_t = np.iinfo(np_t)
        x = rng.choice(np.array([info_t.min, 0, 1, info_t.max], np_t), (8, 4))
    v, k = run(g, x)
    want = np.asarray(jax.numpy.argsort(x, axis=1, descending=True, stable=True))
    np.testing.assert_array_equal(k, want)
    np.testing.assert_array_equal(v, np.take_along_axis(x, want, axis=1))


@pytest.mark.parametrize("body,what", [
    ("  ROOT %r = pred[] compare(%x1, %y1), direction=LT", "other operand"),
    ("  ROOT %r = pred[] compare(%x0, %y0), direction=LE", "not strict"),
    ("  ROOT %r = pred[] compare(%y0, %x0), direction=NE", "not an order"),
    (("  %a = pred[] compare(%x0, %y0), direction=LT\n"
      "  %e = pred[] compare(%x0, %y0), direction=EQ\n"
      "  %b = pred[] compare(%x1, %y1), direction=LT\n"
      "  %c = pred[] and(%e, %b)\n"
      "  ROOT %r = pred[] or(%a, %c)"), "two keys"),
])
def test_unsupported_comparators_are_unknown_ops_at_the_sort_line(body, what):
    text = sort_module(body)
    with pytest.raises(UnknownOpError) as ei:
        lower(text)
    e = ei.value
    assert (e.file, e.line) == ("t.hlo", sort_line(text)), what
    assert "does not order like a < b or a > b on operand 0 alone" in e.message
    assert "\n" not in str(e)


def test_comparator_that_cannot_be_evaluated_names_the_sort():
    body = "  %c = f32[] cosine(%x0)\n  %r2 = pred[] custom-call(%c), custom_call_target=\"Nope\"\n" \
           "  ROOT %r = pred[] and(%r2, %r2)"
    text = sort_module(body)
    with pytest.raises(UnknownOpError) as ei:
        lower(text)
    assert ei.value.line == sort_line(text) and "comparator %cmp cannot be evaluated" in ei.value.message


def test_comparator_reading_the_rank_is_refused():
    text = sort_module(LT).replace("  ROOT %r = pred[] compare(%x0, %y0), direction=LT",
                                   "  %p = u32[] partition-id()\n  %z = u32[] constant(0)\n"
                                   "  %q = pred[] compare(%p, %z), direction=EQ\n"
                                   "  %l = pred[] compare(%x0, %y0), direction=LT\n"
                                   "  ROOT %r = pred[] and(%q, %l)")
    with pytest.raises(UnknownOpError) as ei:
        lower(text)
    assert ei.value.line == sort_line(text) and "uses axis_index" in ei.value.message


def test_bit_reinterpretation_stays_unknown_outside_comparators():
    text = """HloModule m

ENTRY %main (x: f32[4]) -> s32[4] {
  %x = f32[4]{0} parameter(0)
  ROOT %b = s32[4]{0} bitcast-convert(%x)
}
"""
    with pytest.raises(UnknownOpError) as ei:
        lower(text)
    assert ei.value.line == 5 and "reinterprets the bits" in ei.value.message


@pytest.mark.parametrize("src,dst", [("float32", "int32"), ("bfloat16", "int16"),
                                     ("int32", "float32"), ("float16", "uint16")])
def test_bitcast_convert_evaluates_like_lax(src, dst):
    x = np.array([-2.5, -0.0, 0.0, 1.0, 3e4, -np.inf]).astype(jax.numpy.dtype(src)) \
        if not src.startswith("int") else np.array([-1, 0, 1, 2 ** 31 - 1], np.int32)
    got = evaluate("bitcast_convert", {"from": src}, [x], x.shape, dst)
    want = np.asarray(lax.bitcast_convert_type(x, jax.numpy.dtype(dst)))
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


# ---------------------------------------------------------------- verification

@pytest.mark.parametrize("body", [LT, GT], ids=["ascending", "descending"])
def test_sort_along_a_dim_each_rank_holds_whole_verifies(tmp_path, body):
    assert_pair_verifies(tmp_path, sort_module(body, 8, dim=1), sort_module(body, 4, dim=1, parts=2),
                         [f"out{i} = concat(r0.out{i}, r1.out{i}; dim 0)" for i in range(2)])


def test_sort_along_a_split_dim_is_not_verified_and_located(tmp_path):
    text = sort_module(LT, 4, dim=0, parts=2)
    res = verify_texts(tmp_path, sort_module(LT, 8, dim=0), text)
    assert not res.verified
    first = res.failures[0]
    assert (first.op, first.file, first.line) == ("sort", str(tmp_path / "dist.hlo"), sort_line(text))


def test_topk_along_a_split_dim_is_not_verified(tmp_path):
    def topk(n, parts):
        return f"""HloModule m, num_partitions={parts}

ENTRY %main (x: f32[4,{n}]) -> f32[4,2] {{
  %x = f32[4,{n}]{{1,0}} parameter(0)
  %t = (f32[4,2]{{1,0}}, s32[4,2]{{1,0}}) topk(%x), k=2, largest=true
  ROOT %v = f32[4,2]{{1,0}} get-tuple-element(%t), index=0
}}
"""
    res = verify_texts(tmp_path, topk(8, 1), topk(4, 2))
    assert not res.verified
    assert (res.failures[0].op, res.failures[0].line) == ("top_k", 5)


def test_topk_custom_call_with_an_ascending_comparator_is_refused():
    text = (DATA / "top_k_post.hlo").read_text().replace("direction=GT", "direction=LT")
    with pytest.raises(UnknownOpError) as ei:
        lower(text, "k.hlo")
    assert "the k smallest" in ei.value.message and ei.value.file == "k.hlo"

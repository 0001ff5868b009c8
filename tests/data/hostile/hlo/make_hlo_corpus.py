"""Writes the malformed HLO inputs of tests/data/hostile/hlo/ and their
manifest expected.toml (format: tests/data/hostile/make_corpus.py). Run from
the repository root:

    python tests/data/hostile/hlo/make_hlo_corpus.py

Each entry of CASES is one module with exactly one fault. The line holding
the fault is marked with `@@` at its start (the mark is removed when the file
is written); the expected one-line error names the file and that line
("NAME.hlo:LINE:") and contains the entry's message fragment.
tests/test_hlo_validate.py parses every case and checks both.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class HloCase:
    name: str          # file name
    text: str          # module text; the faulty line starts with "@@"
    message: str       # a fragment of the error message
    extra_args: tuple[str, ...] = ()   # more CLI options after `check FILE FILE`

    @property
    def line(self) -> int:
        return next(i for i, ln in enumerate(self.text.split("\n"), 1) if ln.startswith("@@"))

    @property
    def content(self) -> str:
        return "\n".join(ln[2:] if ln.startswith("@@") else ln for ln in self.text.split("\n"))


def entry(*body: str, header: str = "HloModule m", before: str = "") -> str:
    """A module: header, optional computations, then ENTRY with `body` lines."""
    return "\n".join([header, "", *([before] if before else []),
                      "ENTRY %main {", *body, "}", ""])   # no signature: each case has one fault


ADD = """%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""
BY_INDEX = """%by_index (a: f32[], b: f32[], c: s32[], d: s32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %c = s32[] parameter(2)
  %d = s32[] parameter(3)
  ROOT %lt = pred[] compare(%c, %d), direction=LT
}
"""
LE = """%le (a: f32[], b: f32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %le = pred[] compare(%a, %b), direction=LE
}
"""
P8 = "  %p = f32[8]{0} parameter(0)"
P23 = "  %p = f32[2,3]{1,0} parameter(0)"

CASES = [
    # elementwise
    HloCase("multiply_shapes.hlo", entry("  %x = f32[32]{0} parameter(0)", "  %y = f32[16]{0} parameter(1)",
            "@@  ROOT %m = f32[32]{0} multiply(%x, %y)"), "operand shapes differ"),
    HloCase("add_result_shape.hlo", entry(P8, "@@  ROOT %a = f32[9]{0} add(%p, %p)"), "declares the result"),
    HloCase("add_element_types.hlo", entry(P8, "  %i = s32[8]{0} parameter(1)",
            "@@  ROOT %a = f32[8]{0} add(%p, %i)"), "element types differ"),
    HloCase("negate_shape.hlo", entry(P8, "@@  ROOT %n = f32[4]{0} negate(%p)"), "declares the result"),
    HloCase("unary_two_operands.hlo", entry(P8, "@@  ROOT %n = f32[8]{0} exponential(%p, %p)"), "takes 1 operand"),
    HloCase("compare_not_pred.hlo", entry(P8, "@@  ROOT %c = f32[8]{0} compare(%p, %p), direction=LT"), "pred"),
    HloCase("select_pred_shape.hlo", entry(P8, "  %q = pred[4]{0} parameter(1)",
            "@@  ROOT %s = f32[8]{0} select(%q, %p, %p)"), "predicate"),
    HloCase("select_branches.hlo", entry(P8, "  %q = pred[8]{0} parameter(1)", "  %r = f32[4]{0} parameter(2)",
            "@@  ROOT %s = f32[8]{0} select(%q, %p, %r)"), "branch shapes differ"),
    HloCase("clamp_bound.hlo", entry(P8, "  %lo = f32[3]{0} parameter(1)",
            "@@  ROOT %c = f32[8]{0} clamp(%lo, %p, %lo)"), "clamp bound"),
    HloCase("convert_shape.hlo", entry(P8, "@@  ROOT %c = s32[2,4]{1,0} convert(%p)"), "declares the result"),
    # data movement
    HloCase("broadcast_dim_size.hlo", entry("  %p = f32[3]{0} parameter(0)",
            "@@  ROOT %b = f32[4,5]{1,0} broadcast(%p), dimensions={1}"), "does not match result dim"),
    HloCase("broadcast_dim_count.hlo", entry(P23, "@@  ROOT %b = f32[2,3,4]{2,1,0} broadcast(%p), dimensions={0}"),
            "operand rank"),
    HloCase("reshape_count.hlo", entry(P23, "@@  ROOT %r = f32[7]{0} reshape(%p)"), "changes the element count"),
    HloCase("bitcast_count.hlo", entry(P23, "@@  ROOT %r = f32[5]{0} bitcast(%p)"), "changes the element count"),
    HloCase("literal_out_of_range.hlo", entry("@@  ROOT %c = s32[] constant(2147483648)"),
            "out of range for int32", ("--ranks", "2")),
    HloCase("transpose_result.hlo", entry(P23, "@@  ROOT %t = f32[2,3]{1,0} transpose(%p), dimensions={1,0}"),
            "transpose of"),
    HloCase("transpose_not_permutation.hlo", entry(P23, "@@  ROOT %t = f32[3,2]{1,0} transpose(%p), dimensions={1,1}"),
            "not a permutation"),
    HloCase("reverse_dims.hlo", entry(P8, "@@  ROOT %r = f32[8]{0} reverse(%p), dimensions={3}"), "reverse dimensions"),
    HloCase("slice_out_of_bounds.hlo", entry(P8, "@@  ROOT %s = f32[10]{0} slice(%p), slice={[0:10]}"),
            "outside dim 0"),
    HloCase("slice_result.hlo", entry(P8, "@@  ROOT %s = f32[5]{0} slice(%p), slice={[0:8:2]}"), "gives [4]"),
    HloCase("slice_rank.hlo", entry(P23, "@@  ROOT %s = f32[2]{0} slice(%p), slice={[0:2]}"), "one range per dim"),
    HloCase("dynamic_slice_sizes.hlo", entry(P8, "  %i = s32[] parameter(1)",
            "@@  ROOT %d = f32[9]{0} dynamic-slice(%p, %i), dynamic_slice_sizes={9}"), "do not fit"),
    HloCase("dynamic_slice_indices.hlo", entry(P23, "  %i = s32[] parameter(1)",
            "@@  ROOT %d = f32[1,3]{1,0} dynamic-slice(%p, %i), dynamic_slice_sizes={1,3}"), "scalar start indices"),
    HloCase("dynamic_slice_float_index.hlo", entry(P8, "  %i = f32[] parameter(1)",
            "@@  ROOT %d = f32[2]{0} dynamic-slice(%p, %i), dynamic_slice_sizes={2}"), "not an integer"),
    HloCase("dynamic_update_slice_big.hlo", entry(P8, "  %u = f32[9]{0} parameter(1)", "  %i = s32[] parameter(2)",
            "@@  ROOT %d = f32[8]{0} dynamic-update-slice(%p, %u, %i)"), "does not fit"),
    HloCase("concatenate_other_dims.hlo", entry(P23, "  %q = f32[2,4]{1,0} parameter(1)",
            "@@  ROOT %c = f32[4,3]{1,0} concatenate(%p, %q), dimensions={0}"), "other dims differ"),
    HloCase("concatenate_result.hlo", entry(P23, "@@  ROOT %c = f32[5,3]{1,0} concatenate(%p, %p), dimensions={0}"),
            "gives [4,3]"),
    HloCase("pad_result.hlo", entry(P8, "  %z = f32[] constant(0)",
            "@@  ROOT %q = f32[12]{0} pad(%p, %z), padding=1_1"), "gives [10]"),
    HloCase("iota_dimension.hlo", entry("@@  ROOT %i = s32[4]{0} iota(), iota_dimension=2"), "iota_dimension"),
    HloCase("gather_result.hlo", entry("  %x = f32[5,4]{1,0} parameter(0)", "  %i = s32[3,1]{1,0} parameter(1)",
            "@@  ROOT %g = f32[3,5]{1,0} gather(%x, %i), offset_dims={1}, collapsed_slice_dims={0}, "
            "start_index_map={0}, index_vector_dim=1, slice_sizes={1,4}"), "gather gives [3,4]"),
    HloCase("gather_slice_sizes.hlo", entry("  %x = f32[5,4]{1,0} parameter(0)", "  %i = s32[3,1]{1,0} parameter(1)",
            "@@  ROOT %g = f32[3,9]{1,0} gather(%x, %i), offset_dims={1}, collapsed_slice_dims={0}, "
            "start_index_map={0}, index_vector_dim=1, slice_sizes={1,9}"), "slice_sizes"),
    HloCase("scatter_result.hlo", entry("  %x = f32[5,4]{1,0} parameter(0)", "  %i = s32[3,1]{1,0} parameter(1)",
            "  %u = f32[3,4]{1,0} parameter(2)",
            "@@  ROOT %s = f32[6,4]{1,0} scatter(%x, %i, %u), update_window_dims={1}, "
            "inserted_window_dims={0}, scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add",
            before=ADD), "scatter into"),
    # sorting: the comparator is evaluated on probe values (frontends/hlo/comparator.py)
    HloCase("sort_comparator_other_operand.hlo", entry(P8, "  %i = s32[8]{0} iota(), iota_dimension=0",
            "@@  %s = (f32[8]{0}, s32[8]{0}) sort(%p, %i), dimensions={0}, to_apply=%by_index",
            "  ROOT %v = f32[8]{0} get-tuple-element(%s), index=0", before=BY_INDEX),
            "does not order like a < b or a > b", ("--ranks", "2")),
    HloCase("sort_comparator_not_strict.hlo", entry(
            P8, "@@  ROOT %s = f32[8]{0} sort(%p), dimensions={0}, to_apply=%le", before=LE),
            "does not order like a < b or a > b", ("--ranks", "2")),
    HloCase("sort_result_shape.hlo", entry(
            P8, "@@  ROOT %s = f32[9]{0} sort(%p), dimensions={0}, to_apply=%le", before=LE),
            "sort operands must share", ("--ranks", "2")),
    HloCase("topk_smallest.hlo", entry(
            P23, "@@  %t = (f32[2,2]{1,0}, s32[2,2]{1,0}) topk(%p), k=2, largest=false",
            "  ROOT %v = f32[2,2]{1,0} get-tuple-element(%t), index=0"), "largest=false", ("--ranks", "2")),
    HloCase("batch_norm_feature_index.hlo", entry(
            P23, "  %s = f32[3]{0} parameter(1)",
            "@@  %t = (f32[2,3]{1,0}, f32[3]{0}, f32[3]{0}) batch-norm-training(%p, %s, %s), "
            "epsilon=0.001, feature_index=2",
            "  ROOT %y = f32[2,3]{1,0} get-tuple-element(%t), index=0"), "feature_index", ("--ranks", "2")),
    # contractions and reductions
    HloCase("dot_contracting.hlo", entry("  %a = f32[4,8]{1,0} parameter(0)", "  %b = f32[7,5]{1,0} parameter(1)",
            "@@  ROOT %d = f32[4,5]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
            "contracting dims differ"),
    HloCase("dot_result.hlo", entry("  %a = f32[4,8]{1,0} parameter(0)", "  %b = f32[8,5]{1,0} parameter(1)",
            "@@  ROOT %d = f32[5,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}"),
            "gives [4,5]"),
    HloCase("dot_batch.hlo", entry("  %a = f32[2,4,8]{2,1,0} parameter(0)", "  %b = f32[3,8,5]{2,1,0} parameter(1)",
            "@@  ROOT %d = f32[2,4,5]{2,1,0} dot(%a, %b), lhs_batch_dims={0}, rhs_batch_dims={0}, "
            "lhs_contracting_dims={2}, rhs_contracting_dims={1}"), "batch dims differ"),
    HloCase("dot_dim_range.hlo", entry("  %a = f32[4,8]{1,0} parameter(0)", "  %b = f32[8,5]{1,0} parameter(1)",
            "@@  ROOT %d = f32[4,5]{1,0} dot(%a, %b), lhs_contracting_dims={2}, rhs_contracting_dims={0}"),
            "distinct dims"),
    HloCase("reduce_result.hlo", entry(P23, "  %z = f32[] constant(0)",
            "@@  ROOT %r = f32[2]{0} reduce(%p, %z), dimensions={0}, to_apply=%add", before=ADD), "gives [3]"),
    HloCase("reduce_dims.hlo", entry(P23, "  %z = f32[] constant(0)",
            "@@  ROOT %r = f32[2]{0} reduce(%p, %z), dimensions={5}, to_apply=%add", before=ADD),
            "reduce dimensions"),
    HloCase("reduce_init_not_scalar.hlo", entry(P23, "  %z = f32[3]{0} parameter(1)",
            "@@  ROOT %r = f32[3]{0} reduce(%p, %z), dimensions={0}, to_apply=%add", before=ADD), "not a scalar"),
    # collectives
    HloCase("all_reduce_shape.hlo", entry(P8, "@@  ROOT %r = f32[4]{0} all-reduce(%p), replica_groups={{0,1}}, "
            "to_apply=%add", header="HloModule m, num_partitions=2", before=ADD), "all-reduce of"),
    HloCase("all_gather_size.hlo", entry(P8, "@@  ROOT %g = f32[24]{0} all-gather(%p), dimensions={0}, "
            "replica_groups={{0,1}}", header="HloModule m, num_partitions=2"), "over groups of 2"),
    HloCase("reduce_scatter_size.hlo", entry(P8, "@@  ROOT %g = f32[3]{0} reduce-scatter(%p), dimensions={0}, "
            "replica_groups={{0,1}}, to_apply=%add", header="HloModule m, num_partitions=2", before=ADD),
            "over groups of 2"),
    HloCase("all_to_all_split.hlo", entry("  %p = f32[3]{0} parameter(0)",
            "@@  ROOT %a = f32[3]{0} all-to-all(%p), dimensions={0}, replica_groups={{0,1}}",
            header="HloModule m, num_partitions=2"), "does not split"),
    HloCase("collective_permute_shape.hlo", entry(P8, "@@  ROOT %c = f32[4]{0} collective-permute(%p), "
            "source_target_pairs={{0,1},{1,0}}", header="HloModule m, num_partitions=2"), "collective-permute of"),
    HloCase("replica_groups_huge_iota.hlo", entry(P8, "@@  ROOT %r = f32[8]{0} all-reduce(%p), "
            "replica_groups=[2,99999999999]<=[199999999998], to_apply=%add",
            header="HloModule m, num_partitions=2", before=ADD), "supported maximum"),
    # structure and calls
    HloCase("tuple_shape.hlo", entry(P8, "@@  ROOT %t = (f32[8]{0}, f32[2]{0}) tuple(%p, %p)"), "tuple of"),
    HloCase("get_tuple_element_index.hlo", entry(P8, "  %t = (f32[8]{0}) tuple(%p)",
            "@@  ROOT %g = f32[8]{0} get-tuple-element(%t), index=1"), "get-tuple-element index"),
    HloCase("get_tuple_element_shape.hlo", entry(P8, "  %s = f32[2]{0} slice(%p), slice={[0:2]}",
            "  %t = (f32[8]{0}, f32[2]{0}) tuple(%p, %s)",
            "@@  ROOT %g = f32[8]{0} get-tuple-element(%t), index=1"), "element 1"),
    HloCase("call_operand_shape.hlo", entry(P8, "@@  ROOT %c = f32[4]{0} call(%p), to_apply=%neg4",
            before="%neg4 (x: f32[4]) -> f32[4] {\n  %x = f32[4]{0} parameter(0)\n  ROOT %n = f32[4]{0} negate(%x)\n}\n"),
            "parameter 0 of %neg4"),
    HloCase("call_parameter_number.hlo", entry(P8, "@@  ROOT %f = f32[8]{0} fusion(%p), kind=kLoop, calls=%neg",
            before="%neg (x: f32[8]) -> f32[8] {\n  %x = f32[8]{0} parameter(7)\n  ROOT %n = f32[8]{0} negate(%x)\n}\n"),
            "numbers its parameters [7], not 0..0"),
    HloCase("fusion_result_shape.hlo", entry(P8, "@@  ROOT %f = f32[4]{0} fusion(%p), kind=kLoop, calls=%neg",
            before="%neg (x: f32[8]) -> f32[8] {\n  %x = f32[8]{0} parameter(0)\n  ROOT %n = f32[8]{0} negate(%x)\n}\n"),
            "fusion returns"),
    HloCase("while_body_shape.hlo", entry("  %i = s32[] constant(0)",
            "@@  ROOT %w = s32[] while(%i), condition=%cond, body=%body",
            before="%cond (c: s32[]) -> pred[] {\n  %c = s32[] parameter(0)\n  %k = s32[] constant(3)\n"
                   "  ROOT %lt = pred[] compare(%c, %k), direction=LT\n}\n\n"
                   "%body (b: s32[]) -> s32[2] {\n  %b = s32[] parameter(0)\n"
                   "  ROOT %bb = s32[2]{0} broadcast(%b), dimensions={}\n}\n"), "the body returns"),
    HloCase("recursive_call.hlo", entry(P8, "  ROOT %c = f32[8]{0} call(%p), to_apply=%loop",
            before="%loop (x: f32[8]) -> f32[8] {\n  %x = f32[8]{0} parameter(0)\n"
                   "@@  ROOT %c = f32[8]{0} call(%x), to_apply=%loop\n}\n"), "levels deep", ("--ranks", "2")),
    HloCase("collective_permute_twice.hlo", entry(P8, "@@  ROOT %c = f32[8]{0} collective-permute(%p), "
            "source_target_pairs={{0,1},{1,0},{0,0}}", header="HloModule m, num_partitions=2"),
            "source 0 more than once"),
    # the computation's signature against its body
    HloCase("signature_parameter_shape.hlo", "HloModule m\n\nENTRY %main (p: f32[4]) -> f32[8] {\n"
            "@@  ROOT %p = f32[8]{0} parameter(0)\n}\n", "parameter 0 is float32[4] in the signature"),
    HloCase("signature_parameter_count.hlo", "HloModule m\n\n@@ENTRY %main () -> f32[8] {\n"
            "  ROOT %p = f32[8]{0} parameter(0)\n}\n", "its signature has 0 parameters, its body 1"),
    HloCase("signature_result.hlo", "HloModule m\n\nENTRY %main (p: f32[8]) -> f32[] {\n"
            "@@  ROOT %p = f32[8]{0} parameter(0)\n}\n", "the signature returns float32[]"),
    HloCase("entry_layout.hlo", "@@HloModule m, entry_computation_layout={(f32[4]{0})->f32[8]{0}}\n\n"
            "ENTRY %main {\n  ROOT %p = f32[8]{0} parameter(0)\n}\n", "parameter 0 is float32[4]"),
    # sizes and limits
    HloCase("num_partitions_huge.hlo", "@@HloModule m, num_partitions=99999999999\n\nENTRY %main () -> f32[] {\n"
            "  ROOT %c = f32[] constant(1)\n}\n", "supported maximum"),
    HloCase("replica_count_times_partitions.hlo", "@@HloModule m, num_partitions=1024, replica_count=1024\n\n"
            "ENTRY %main () -> f32[] {\n  ROOT %c = f32[] constant(1)\n}\n", "supported maximum"),
    HloCase("num_partitions_zero.hlo", "@@HloModule m, num_partitions=0\n\nENTRY %main () -> f32[] {\n"
            "  ROOT %c = f32[] constant(1)\n}\n", "not a positive integer"),
    HloCase("dim_too_big.hlo", entry("@@  ROOT %p = f32[99999999999]{0} parameter(0)"), "exceeds"),
    HloCase("elements_too_many.hlo", entry("@@  ROOT %p = f32[2147483648,2147483648]{1,0} parameter(0)"),
            "more than the supported"),
    HloCase("tuple_nested_5000.hlo", entry("@@  ROOT %p = " + "(" * 5000 + "f32[1]" + ")" * 5000 + " parameter(0)"),
            "nested deeper"),
    HloCase("sharding_nested_5000.hlo", entry("@@  ROOT %p = f32[1]{0} parameter(0), sharding="
            + "{" * 5000 + "replicated" + "}" * 5000), "nested deeper", ("--ranks", "2")),
]

# Options that are hostile with a valid-looking file.
RANKS_HUGE = HloCase("ranks_option_huge.hlo", "@@HloModule m\n\nENTRY %main () -> f32[] {\n"
                     "  ROOT %c = f32[] constant(1)\n}\n", "ranks", ("--ranks", "99999999999"))


def _toml_str(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main() -> None:
    entries = []
    for case in CASES + [RANKS_HUGE]:
        (HERE / case.name).write_text(case.content)
        contains = f"{case.name}:{case.line}:" if case is not RANKS_HUGE else "ranks"
        args = ["check", "{file}", "{file}", *case.extra_args]
        entries.append(f'[files."{case.name}"]\nexit = 2\ncontains = {_toml_str(contains)}\n'
                       f"args = [{', '.join(_toml_str(a) for a in args)}]")
    header = ("# Malformed HLO modules, one fault each: exit 2 with a one-line error naming\n"
              "# the file and the faulty line. Written by make_hlo_corpus.py: edit that.\n"
              "#\n"
              "# [files.\"NAME\"]   one input file of this folder\n"
              "# exit = 2         the expected exit code\n"
              "# contains = \"..\" a substring of the one-line error (here NAME:LINE:)\n"
              "# args = [...]     the dlverify command line, {file} = this file's absolute path\n\n")
    (HERE / "expected.toml").write_text(header + "\n\n".join(entries) + "\n")


if __name__ == "__main__":
    main()

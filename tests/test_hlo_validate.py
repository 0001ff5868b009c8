"""Validated HLO: every malformed module of tests/data/hostile/hlo/ (one fault
each, see make_hlo_corpus.py) is an InputError naming its file and the faulty
line; the bounds on ranks, dims, nesting and call depth hold; well-formed
modules still pass."""
import importlib.util
import sys
from pathlib import Path

import pytest

from dlverify.errors import InputError
from dlverify.frontends.hlo import MAX_RANKS, hlo_to_graph, parse_hlo_module
from dlverify.frontends.hlo.pairing import resolve_ranks
from dlverify.frontends.hlo.text import split_top, strip_comments_and_depth, unescape
from dlverify.ir import IdAllocator

CORPUS = Path(__file__).resolve().parent / "data" / "hostile" / "hlo"
_spec = importlib.util.spec_from_file_location("make_hlo_corpus", CORPUS / "make_hlo_corpus.py")
corpus = importlib.util.module_from_spec(_spec)
sys.modules["make_hlo_corpus"] = corpus   # dataclasses look their module up
_spec.loader.exec_module(corpus)


def parse_and_lower(text: str, file: str):
    module = parse_hlo_module(text, file)
    return hlo_to_graph(module, IdAllocator(), "g", ranks=2)


@pytest.mark.parametrize("case", corpus.CASES, ids=lambda c: c.name)
def test_malformed_module_names_file_and_line(case):
    with pytest.raises(InputError) as ei:
        parse_and_lower(case.content, case.name)
    e = ei.value
    assert (e.file, e.line) == (case.name, case.line), e
    assert case.message in e.message, e
    assert "\n" not in str(e)


def test_corpus_files_are_written_from_the_table():
    names = {c.name for c in corpus.CASES} | {corpus.RANKS_HUGE.name}
    for case in corpus.CASES + [corpus.RANKS_HUGE]:
        assert (CORPUS / case.name).read_text() == case.content, case.name
    manifest = (CORPUS / "expected.toml").read_text()
    assert all(f'[files."{n}"]' in manifest for n in names)
    assert len(names) >= 40


def test_rank_option_is_bounded():
    module = parse_hlo_module(corpus.RANKS_HUGE.content, "r.hlo")
    with pytest.raises(InputError, match=f"1..{MAX_RANKS}"):
        resolve_ranks(module, 99999999999, None)
    assert resolve_ranks(module, MAX_RANKS, None).n == MAX_RANKS
    with pytest.raises(InputError, match="supported"):
        hlo_to_graph(module, IdAllocator(), "g", ranks=MAX_RANKS + 1)


def test_well_formed_twins_pass():
    """The fixed twin of each shape rule is accepted (the checks are not too strict)."""
    ok = """HloModule m, num_partitions=2

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main {
  %x = f32[4,8]{1,0} parameter(0)
  %y = f32[8,5]{1,0} parameter(1)
  %i = s32[3,1]{1,0} parameter(2)
  %d = f32[4,5]{1,0} dot(%x, %y), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %m = f32[4,5]{1,0} multiply(%d, %d)
  %b = f32[2,4,5]{2,1,0} broadcast(%m), dimensions={1,2}
  %t = f32[5,4]{1,0} transpose(%m), dimensions={1,0}
  %s = f32[3,2]{1,0} slice(%t), slice={[0:5:2], [1:3]}
  %c = f32[8,2]{1,0} concatenate(%s, %s, %s2), dimensions={0}
  %s2 = f32[2,2]{1,0} slice(%t), slice={[0:2], [0:2]}
  %z = f32[] constant(0)
  %p = f32[10,2]{1,0} pad(%c, %z), padding=1_1x0_0
  %r = f32[2]{0} reduce(%p, %z), dimensions={0}, to_apply=%add
  %g = f32[3,8]{1,0} gather(%x, %i), offset_dims={1}, collapsed_slice_dims={0}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,8}
  %ag = f32[8,8]{1,0} all-gather(%x), dimensions={0}, replica_groups={{0,1}}
  %rs = f32[2,8]{1,0} reduce-scatter(%x), dimensions={0}, replica_groups={{0,1}}, to_apply=%add
  %ar = f32[4,5]{1,0} all-reduce(%m), replica_groups={{0,1}}, to_apply=%add
  %k = s32[] constant(1)
  %ds = f32[1,5]{1,0} dynamic-slice(%m, %k, %k), dynamic_slice_sizes={1,5}
  %tp = (f32[2]{0}, f32[3,8]{1,0}) tuple(%r, %g)
  %ge = f32[3,8]{1,0} get-tuple-element(%tp), index=1
  ROOT %out = (f32[2,4,5]{2,1,0}, f32[10,2]{1,0}, f32[3,8]{1,0}, f32[8,8]{1,0}, f32[2,8]{1,0}, f32[4,5]{1,0}, f32[1,5]{1,0}) tuple(%b, %p, %ge, %ag, %rs, %ar, %ds)
}
"""
    parse_and_lower(ok, "ok.hlo")


def test_text_scanning_is_iterative_and_exact():
    # Escapes: \\ is one backslash, \" a quote, \n a newline.
    assert unescape(r'a\\nb\"c\nd') == 'a\\nb"c\nd'
    assert split_top('a, "b,\\"c", d(e,f), {g,h}') == ['a', '"b,\\"c"', 'd(e,f)', '{g,h}']
    assert strip_comments_and_depth('x /*c*/ "s/*n*/" (y', 0, False) == ('x  "s/*n*/" (y', 1, False)
    deep = "(" * 100000 + ")" * 100000
    assert strip_comments_and_depth(deep, 0, False)[1] == 0
    assert split_top(deep + ", x") == [deep, "x"]

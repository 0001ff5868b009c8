"""The schema is declared once in Python; datalog/schema.dl is generated from it."""
from pathlib import Path

from dlverify import schema as S

ROOT = Path(__file__).resolve().parent.parent


def test_generated_schema_dl_is_fresh():
    on_disk = (ROOT / "datalog" / "schema.dl").read_text()
    assert on_disk == S.render_decls(), (
        "datalog/schema.dl is stale: run `python -m dlverify.schema`")


def test_relation_names_unique_and_typed():
    names = [r.name for r in S.RELATIONS]
    assert len(names) == len(set(names))
    for rel in S.RELATIONS:
        assert rel.doc, rel.name
        for col in rel.columns:
            assert col.type in S.TYPE_NAMES


def test_every_input_relation_is_used_by_some_rule():
    rules = "".join(p.read_text() for p in (ROOT / "datalog").glob("*.dl") if p.name != "schema.dl")
    unused = [r.name for r in S.RELATIONS if f"{r.name}(" not in rules]
    assert unused == [], f"declared but never used by a rule: {unused}"


def test_every_rule_file_has_a_header_and_documented_decls():
    for p in (ROOT / "datalog").glob("*.dl"):
        lines = p.read_text().splitlines()
        assert lines[0].startswith("//"), f"{p.name}: missing header comment"
        for i, line in enumerate(lines):
            if line.startswith(".decl"):
                prev = "\n".join(lines[max(0, i - 3):i])
                assert "*/" in prev, f"{p.name}:{i + 1}: .decl without a doc comment"


# ---------------------------------------------------------------- named constants

RULE_FILES = [p for p in (ROOT / "datalog").glob("*.dl") if p.name != "schema.dl"]


def test_constants_are_generated_as_one_fact_each():
    text = S.render_decls()
    for const in S.CONSTANTS:
        assert f".decl {const.name}({const.column.name}: {const.column.type})" in text
        assert f"\n{const.name}({const.literal()}).\n" in text
    assert S.UNIT.literal() == "[0, 0, 0, 0]" and S.UNIT.value == S.UNIT_SCALE
    assert [c.value for c in S.REDUCER_CONSTANTS] == [S.REDUCER_CODE[n] for n in S.REDUCERS]
    assert len({f.key for f in S.RULE_FAMILIES}) == len(S.RULE_FAMILIES)


def test_family_keys_are_used_by_their_files_only_and_never_as_literals():
    import re

    for fam in S.RULE_FAMILIES:
        users = [p.name for p in RULE_FILES if f"{fam.const.name}(" in p.read_text()]
        assert users == [fam.file], (fam.const.name, users)
    for p in RULE_FILES:
        for m in re.finditer(r"(Asm_Start|Emit)\([^\[\n]*\[(\d+),", p.read_text()):
            raise AssertionError(f"{p.name}: literal family key {m.group(2)} in {m.group(0)}")


def test_unit_scale_is_never_a_literal_in_the_rules():
    for p in RULE_FILES:
        assert "[0, 0, 0, 0]" not in p.read_text(), f"{p.name}: write Unit_Scale(unit)"


def test_seed_and_view_columns_by_name():
    assert S.VIEW.column_index("o") == 3 and S.VIEW.column_index("c") == 5
    row = S.SEED.row(id=1, s=2, d=3, r=0, red=-1, op=0, axis=0, lo=0, hi=0, e2=0, e3=0, e5=0, e7=0)
    assert row[S.SEED.column_index("d")] == 3 and len(row) == S.SEED.arity
    import pytest

    with pytest.raises(KeyError):
        S.SEED.row(id=1)
    with pytest.raises(KeyError):
        S.VIEW.column_index("nope")


def test_seed_row_puts_tag_and_scale_in_their_columns():
    row = S.seed_row(7, 1, 2, 3, (0, 9, 1, 4, 8), (1, 0, 2, 0))
    col = S.SEED.column_index
    assert (row[col("id")], row[col("s")], row[col("d")], row[col("r")]) == (7, 1, 2, 3)
    assert tuple(row[col(n)] for n in ("red", "op", "axis", "lo", "hi")) == (0, 9, 1, 4, 8)
    assert tuple(row[col(n)] for n in ("e2", "e3", "e5", "e7")) == (1, 0, 2, 0)
    complete = S.seed_row(1, 1, 2, 0, None, S.UNIT_SCALE)
    assert complete[col("red")] < 0 and complete[col("e2"):] == S.UNIT_SCALE
    assert S.seed_fields(row) == (7, 1, 2, 3, (0, 9, 1, 4, 8), (1, 0, 2, 0))
    assert S.seed_fields(complete) == (1, 1, 2, 0, None, S.UNIT_SCALE)


def test_partial_tag_bases_are_never_literals_in_the_rules():
    import re

    bases = {S.TAG_FLAT_BASE, S.TAG_ADD_BASE, S.TAG_MASK_BASE, S.TAG_WINDOW_BASE}
    for p in RULE_FILES:
        code = "\n".join(line.split("//")[0] for line in p.read_text().splitlines())
        used = {int(n) for n in re.findall(r"\b\d+\b", code)} & bases
        assert not used, f"{p.name}: write Tag_*Base(...) instead of {sorted(used)}"

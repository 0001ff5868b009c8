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

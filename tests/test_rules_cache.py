"""The installed rules' parse kept on disk (dlverify/engine/rules_cache.py): it
is the program a fresh parse gives, and it is never used once a rule file's
bytes differ from those it was made from."""
from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from dlverify import engine
from dlverify.engine import rules_cache
from dlverify.engine.dialect import parse_program, translate
from dlverify.rules.ruleset import installed_main


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(engine, "_LOADED", {})  # no parse of this process reused
    return tmp_path / "dlverify" / "rules"


def _translation(program) -> str:
    return translate(program, shown=sorted(program.outputs)).text


def test_the_stored_parse_is_the_fresh_parse(cache):
    main = installed_main().resolve()
    first = engine.load_rules(main)
    (entry,) = cache.glob("program-*.pickle")
    engine._LOADED.clear()
    again = engine.load_rules(main)
    assert again.program is not first.program  # read back from the entry
    fresh = parse_program(main)
    assert again.texts == first.texts and set(again.texts) == set(fresh.files)
    assert again.program.decls == fresh.decls and again.program.files == fresh.files
    assert _translation(again.program) == _translation(fresh)
    assert entry.stat().st_size > 0


def test_a_changed_rule_file_is_parsed_again(cache):
    main = installed_main().resolve()
    program = parse_program(main)
    texts = {p: p.read_bytes() for p in program.files}
    some = next(iter(texts))
    rules_cache.store(main, program, {**texts, some: texts[some] + b"\n// edited"})
    assert rules_cache.load(main) is None  # the stored bytes are not the file's
    rules_cache.store(main, program, texts)
    assert rules_cache.load(main) is not None


def test_a_broken_entry_is_ignored_and_replaced(cache):
    main = installed_main().resolve()
    engine.load_rules(main)
    (entry,) = cache.glob("program-*.pickle")
    entry.write_bytes(b"not a pickle")
    assert rules_cache.load(main) is None
    engine._LOADED.clear()
    assert engine.load_rules(main).program.decls == parse_program(main).decls
    assert isinstance(pickle.loads(entry.read_bytes())[0], type(parse_program(main)))


def test_other_rule_sets_are_not_stored(cache, tmp_path):
    main = tmp_path / "rules" / "main.dl"
    main.parent.mkdir()
    main.write_text(".decl A(x: number)\n.input A\n.decl B(x: number)\n.output B\nB(x) :- A(x).\n")
    engine.load_rules(main)
    assert not cache.exists() or not list(cache.iterdir())
    assert rules_cache.load(main.resolve()) is None

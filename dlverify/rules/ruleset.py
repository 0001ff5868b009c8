"""A rule set: a folder with a main.dl, parsed and checked by the engine, then checked
against the schema it must consume and produce (dlverify/schema.py).

The engine's checker already refuses what Soufflé would refuse. On top of that a rule
set run by dlverify must fit the fact export and the judge:
- every relation of the schema is declared with the schema's columns, inputs as
  `.input` and verdict relations as `.output` (include a schema.dl generated from
  dlverify/schema.py);
- it declares no `.input` the fact export does not write;
- every relation a rule reads is derived by some rule or fact, or is a schema input
  (else the rule can never fire: a typo, or a relation of another schema);
- it derives `View` and every verdict output.
Each violation is an InputError naming the file and line (exit 2 in the CLI).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlverify import schema as S
from dlverify.engine import load_rules
from dlverify.engine.syntax import Agg, Atom, Clause, Program, aggs
from dlverify.errors import InputError

MAIN = "main.dl"


@dataclass(frozen=True)
class RuleRef:
    """One rule of a program: its position among the clauses, its head and where it is."""

    index: int
    head: str
    file: str
    line: int

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"

    def short(self, root: Path | None = None) -> str:
        """file:line relative to `root` when the file is under it."""
        if root is not None:
            try:
                return f"{Path(self.file).resolve().relative_to(root.resolve())}:{self.line}"
            except ValueError:
                pass
        return self.location


@dataclass(frozen=True)
class RuleSet:
    """A checked rule program and the folder it came from."""

    folder: Path
    main_dl: Path
    program: Program
    digest: str  # memo.rules_hash of main_dl: part of every cache key

    def rules(self) -> list[RuleRef]:
        """Every clause with a body (facts are not rules: they derive their one tuple)."""
        return [rule_ref(i, c) for i, c in enumerate(self.program.clauses) if c.body]

    def name(self, rule: RuleRef) -> str:
        return rule.short(self.folder)


def rule_ref(index: int, clause: Clause) -> RuleRef:
    return RuleRef(index, clause.head.rel, clause.file, clause.line)


def installed_main() -> Path:
    from dlverify.api import rules_path
    return rules_path()


def main_of(folder: Path | None) -> Path:
    """The main.dl of a rule-set folder (the installed rules when None), not yet checked."""
    if folder is None:
        return installed_main()
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("--rules: " + ("not a folder" if folder.exists() else "no such folder")
                         + f" (expected a folder with a {MAIN})", str(folder))
    main = folder / MAIN
    if not main.is_file():
        raise InputError(f"--rules: no {MAIN} in this folder", str(folder))
    return main


def load_rule_set(folder: Path | None = None) -> RuleSet:
    """Parse, check and schema-check the rule set in `folder` (the installed one when None)."""
    from dlverify.memo import rules_hash

    main = main_of(folder)
    program = load_rules(main).program
    check_against_schema(program)
    return RuleSet(main.parent, main, program, rules_hash(main))


def checked_main(folder: Path | None) -> Path:
    """The main.dl to run for `--rules folder` after the checks (the installed one when None)."""
    return installed_main() if folder is None else load_rule_set(folder).main_dl


def _columns_match(program: Program, rel: S.Relation) -> bool:
    """The same column types, by name: schema.dl is generated, so nothing else is expected."""
    decl = program.decls[rel.name]
    return tuple(ty for _, ty in decl.columns) == tuple(c.type for c in rel.columns)


def check_against_schema(program: Program) -> None:
    main = str(program.main)
    for rel in S.RELATIONS:
        decl = program.decls.get(rel.name)
        if decl is None:
            raise InputError(f"the schema relation {rel.name} is not declared by {MAIN} or its "
                             "includes (#include a schema.dl generated from dlverify/schema.py)", main)
        if not _columns_match(program, rel):
            cols = ", ".join(f"{c.name}: {c.type}" for c in rel.columns)
            raise InputError(f"{rel.name} is declared with other columns than the schema's "
                             f"({cols})", decl.file, decl.line)
        io = program.inputs if rel.role == "input" else program.outputs
        if rel.name not in io:
            raise InputError(f"{rel.name} must be an .{rel.role} (the schema's role for it)",
                             decl.file, decl.line)
    schema_inputs = {r.name for r in S.INPUTS}
    for name, (file, line) in program.inputs.items():
        if name not in schema_inputs:
            raise InputError(f".input {name}: the fact export writes no such relation (see "
                             "dlverify/schema.py)", file, line)
    derived = {c.head.rel for c in program.clauses}
    for c in program.clauses:
        for atom in _read_atoms(c):
            if atom.rel not in derived and atom.rel not in program.inputs:
                raise InputError(f"{atom.rel} is read here but no rule or fact derives it and it "
                                 "is not a schema input", c.file, atom.line)
    for rel in (S.VIEW, *S.OUTPUTS):
        if rel.name not in derived:
            decl = program.decls[rel.name]
            raise InputError(f"the rule set never derives {rel.name} (a rule set must derive View "
                             "and every verdict output)", decl.file, decl.line)


def _read_atoms(c: Clause) -> list[Atom]:
    """The atoms a clause's body reads, inside aggregates too."""
    out = [lit for lit in c.body if isinstance(lit, Atom)]
    for agg in aggs(c.body):
        assert isinstance(agg, Agg)
        out += [lit for lit in agg.body if isinstance(lit, Atom)]
    return out

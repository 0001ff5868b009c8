"""`dlverify spec SEQ DIST`: the relation spec dlverify infers for an HLO pair,
written as TOML for a user to review and commit.

The pair is paired and related exactly as `dlverify check` does with no spec
(or with a partial one: what it states is kept), then verified, so the
expected output relations can be read off the derived views. Every entry
carries one comment with its evidence; the header says whether the pair
verifies under the spec printed. Loading the printed text back with
`dlverify.spec.parse_spec` gives the same relations (tested).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dlverify.ir import IdAllocator
from dlverify.relations import BlockRelation, split_dim_of
from dlverify.spec import OutputSpec, Spec, load_spec


@dataclass(frozen=True)
class InferredSpec:
    """The TOML text of the inferred spec, and whether the pair verifies under it."""

    text: str
    verified: bool


def _output_entry(rel: BlockRelation | None, n: int) -> OutputSpec | None:
    if rel is None:
        return None
    if rel.is_replicated():
        return OutputSpec("replicated")
    d = split_dim_of(rel, n)
    return OutputSpec("concat", d) if d is not None else None


def _comment(text: str) -> str:
    return " ".join(text.split())


def infer_spec(seq_path: str | Path, dist_path: str | Path, spec_path: str | Path | None = None,
               ranks: int | None = None, engine: str = "auto",
               custom_calls: str | Path | dict | None = None) -> InferredSpec:
    """Infer the spec of an HLO pair (see the module docstring). `spec_path`: a
    partial spec whose statements are kept (e.g. its [dist_params])."""
    from dlverify.api import verify_problem
    from dlverify.hlo_api import _registry, hlo_builder
    from dlverify.outputs import infer_output_relation
    from dlverify.trial import verify_by_trial

    spec: Spec | None = load_spec(spec_path) if spec_path is not None else None
    build = hlo_builder(seq_path, dist_path, spec, ranks, _registry(custom_calls))
    outcome = verify_by_trial(build, lambda p, _: verify_problem(p, engine=engine))  # type: ignore
    problem, res, records = outcome.problem, outcome.result, outcome.record
    stated_outputs = list(problem.outputs)   # (verifying infers, it does not fill them in)
    n = problem.mesh.size
    seq_name, dist_name = Path(seq_path).name, Path(dist_path).name
    lines = [f"# Relation spec for {seq_name} (sequential) vs {dist_name} (distributed),",
             "# inferred by `dlverify spec`: review every entry before committing it.",
             "# " + ("The pair verifies under this spec." if res.verified else
                     "The pair is NOT verified under this spec: run `dlverify check` with it "
                     "to see where.")]
    rank_note = records.rank_evidence
    lines += ["", f"ranks = {n}" + (f"    # {_comment(rank_note)}" if rank_note else ""), "",
              "[params]"]
    for rec in records.params:
        if rec.entry is None:
            lines.append(f"# {rec.seq}: no spec entry states this relation ({_comment(rec.evidence)})")
            continue
        stated = spec is not None and rec.seq in spec.params
        why = "stated by the input spec" if stated else (rec.evidence or "stated by the caller")
        lines.append(f"{rec.seq} = {rec.entry.toml()}    # {_comment(why)}")
    if spec is not None and spec.dist_params:
        lines += ["", "[dist_params]"]
        for j, ds in sorted(spec.dist_params.items()):
            lines.append(f"{j} = {ds.describe()}    # stated by the input spec")
    lines += ["", "[outputs]"]
    for idx in range(len(problem.seq.outputs)):
        rel = stated_outputs[idx]
        how = "stated by the input spec"
        stated = spec.outputs.get(idx) if spec is not None and spec.outputs else None
        if stated is not None and stated.kind in ("sum", "mean"):
            lines.append(f'{idx} = "{stated.kind}"    # {how}')
            continue
        if rel is None:
            rel = infer_output_relation(problem, idx, res.views)
            how = "the relation the derived views of this output prove"
        out = _output_entry(rel, n)
        if out is None:
            lines.append(f"# {idx}: no relation proved for this output")
        elif out.kind == "replicated":
            lines.append(f'{idx} = "replicated"    # {how}')
        else:
            lines.append(f"{idx} = {{ concat = {out.dim} }}    # {how}")
    return InferredSpec("\n".join(lines) + "\n", res.verified)


__all__ = ["InferredSpec", "infer_spec"]

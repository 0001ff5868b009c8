"""Soundness and robustness on mutated compiled modules: every correct HLO pair in
a folder kept by `bench/xla_examples.py --keep DIR` that verifies has its
distributed module mutated one instruction at a time (the silent bugs of the
brief: a wrong opcode, a wrong operand, swapped operands, a changed constant, a
collective over the wrong groups or dropped, a slice or a comparison off by one,
dims swapped in a transpose, broadcast or reduce), and each
mutant is verified as an HLO pair with no spec.

    python bench/xla_examples.py --keep /tmp/pairs
    python bench/hlo_mutants.py /tmp/pairs --per-pair 12 --json

With `--side seq` the sequential module is mutated instead (the
reference: the rewrites of the normal form run on both). A mutant that verifies is run on random inputs by the shared evaluator (the
programs as read, before any rewrite) against the relations the verdict
claims: if an output differs, the verdict is UNSOUND (exit 1). A mutant that
verifies and computes what the original computed on every rank is an
equivalent mutant (e.g. max/min of equal operands): not a finding. One whose
outputs differ only by an inf or NaN on one side is counted apart
(verified-nonfinite): equal over the reals, which is what a verdict is about,
but not in floats (a softmax stabilised by another value than its max). Any
exception other than an input error is a CRASH (exit 1). Rejected mutants
(an input error: the mutation broke the module's shapes) are counted.
Deterministic: the mutations are enumerated in file order and sampled with a
fixed seed.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from dlverify.errors import InputError
from dlverify.hlo_api import hlo_problem, relate_elided_constants, verify_hlo
from dlverify.ir import IdAllocator
from dlverify.numeric import run_both, value_error
from dlverify.ops.semantics import NotExecutable
from dlverify.outputs import infer_output_relation

# one instruction with an array result: `%name = f32[4,8]{1,0} opcode(operands), attrs`
INSTR = re.compile(r"^(?P<head>\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = )"
                   r"(?P<shape>[a-z0-9]+\[[0-9,]*\])(?P<layout>\{[0-9,]*\})? "
                   r"(?P<opcode>[a-z\-]+)\((?P<args>[^()]*)\)(?P<rest>.*)$")
SWAPPED_OPCODE = {"add": "subtract", "subtract": "add", "multiply": "add", "divide": "multiply",
                  "maximum": "minimum", "minimum": "maximum", "exponential": "tanh",
                  "tanh": "exponential"}
FLIPPED_DIRECTION = {"LT": "LE", "LE": "LT", "GT": "GE", "GE": "GT", "EQ": "NE", "NE": "EQ"}
ORDERED = ("subtract", "divide", "power", "atan2", "remainder")
TOL = 1e-5
NONFINITE = "an inf or NaN on one side only"
SEEDS = (1, 2, 3)   # random inputs per verified mutant: a bug on some inputs only


@dataclass(frozen=True)
class Mutation:
    """One changed line of the distributed module."""

    kind: str
    line: int            # 1-based
    text: str            # the new line


@dataclass
class Outcome:
    pair: str
    kind: str
    line: int
    result: str          # rejected | not verified | verified-equivalent | UNSOUND | CRASH | skipped
    detail: str = ""
    seconds: float = 0.0


def _operands(args: str) -> list[str]:
    return [a.strip() for a in args.split(",") if a.strip()]


def _opcode_swaps(m: re.Match, line: str) -> Iterator[str]:
    new = SWAPPED_OPCODE.get(m["opcode"])
    if new:
        yield line.replace(f" {m['opcode']}(", f" {new}(", 1)


def _operand_swaps(m: re.Match, line: str) -> Iterator[str]:
    ops = _operands(m["args"])
    if m["opcode"] in ORDERED and len(ops) == 2 and ops[0] != ops[1]:
        yield line.replace(f"({m['args']})", f"({ops[1]}, {ops[0]})", 1)


def _constant_bumps(m: re.Match, line: str) -> Iterator[str]:
    if m["opcode"] == "constant" and m["shape"].endswith("[]"):
        try:
            v = float(m["args"])
        except ValueError:
            return
        new = v + 1 if m["shape"].startswith(("s", "u")) else (v * 2 if v else 1.0)
        text = str(int(new)) if m["shape"].startswith(("s", "u")) else repr(new)
        yield line.replace(f"constant({m['args']})", f"constant({text})", 1)


def _group_changes(m: re.Match, line: str) -> Iterator[str]:
    groups = re.search(r"replica_groups=\{(\{[0-9,]+\}(?:,\{[0-9,]+\})*)\}", line)
    if groups:
        parsed = [g.split(",") for g in re.findall(r"\{([0-9,]+)\}", groups[1])]
        if all(len(g) >= 2 and len(g) % 2 == 0 for g in parsed):
            halves = [h for g in parsed for h in (g[:len(g) // 2], g[len(g) // 2:])]
            yield line.replace(groups[0], "replica_groups={" + ",".join(
                "{" + ",".join(h) + "}" for h in halves) + "}", 1)
        if all(len(g) >= 2 for g in parsed):   # the same groups, members in another order
            rotated = [g[1:] + g[:1] for g in parsed]
            yield line.replace(groups[0], "replica_groups={" + ",".join(
                "{" + ",".join(g) + "}" for g in rotated) + "}", 1)
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[(\d+)\](?!T)", line)
    if iota and int(iota[2]) % 2 == 0 and int(iota[2]) >= 2:   # each group split in two
        g, n = int(iota[1]), int(iota[2])
        yield line.replace(iota[0], f"replica_groups=[{2 * g},{n // 2}]<=[{iota[3]}]", 1)
    pairs = re.search(r"source_target_pairs=\{(\{[0-9]+,[0-9]+\}(?:,\{[0-9]+,[0-9]+\})*)\}", line)
    if pairs:
        flipped = ["{" + ",".join(reversed(p.split(","))) + "}"
                   for p in re.findall(r"\{([0-9]+,[0-9]+)\}", pairs[1])]
        yield line.replace(pairs[0], "source_target_pairs={" + ",".join(flipped) + "}", 1)


def _directions(m: re.Match, line: str) -> Iterator[str]:
    """A comparison off by one (< for <=) or negated."""
    d = re.search(r"direction=([A-Z]+)", line)
    if m["opcode"] == "compare" and d and d[1] in FLIPPED_DIRECTION:
        yield line.replace(d[0], f"direction={FLIPPED_DIRECTION[d[1]]}", 1)


def _dimension_swaps(m: re.Match, line: str) -> Iterator[str]:
    """Two entries of a `dimensions={...}` list swapped, or a one-dim list moved to a
    neighbouring dim (a transpose, broadcast, gather, concatenation or reduction
    over the wrong dims; shapes that no longer fit are rejected)."""
    d = re.search(r"dimensions=\{([0-9,]+)\}", line)
    if d and m["opcode"] != "dynamic-slice":
        dims = d[1].split(",")
        if len(dims) >= 2 and dims[0] != dims[1]:
            dims[0], dims[1] = dims[1], dims[0]
            yield line.replace(d[0], "dimensions={" + ",".join(dims) + "}", 1)
        elif len(dims) == 1:   # a gather, concatenation or reduction along a neighbouring dim
            for k in (int(dims[0]) - 1, int(dims[0]) + 1):
                if k >= 0:
                    yield line.replace(d[0], "dimensions={" + str(k) + "}", 1)


def _dropped_collectives(m: re.Match, line: str) -> Iterator[str]:
    if m["opcode"] == "all-reduce" and len(_operands(m["args"])) == 1:
        yield f"{m['head']}{m['shape']}{m['layout'] or ''} copy({m['args']})"


def _slice_shifts(m: re.Match, line: str) -> Iterator[str]:
    if m["opcode"] != "slice":
        return
    spec = re.search(r"slice=\{([^}]*)\}", line)
    if not spec:
        return
    dims = re.findall(r"\[(\d+):(\d+)(?::(\d+))?\]", spec[1])
    for i, (lo, hi, step) in enumerate(dims):
        if int(lo) >= 1:
            new = list(dims)
            new[i] = (str(int(lo) - 1), str(int(hi) - 1), step)
            text = ", ".join(f"[{a}:{b}" + (f":{s}]" if s else "]") for a, b, s in new)
            yield line.replace(spec[0], "slice={" + text + "}", 1)


def _wrong_operands(m: re.Match, line: str, earlier: dict[str, str]) -> Iterator[str]:
    """An operand replaced by another value of the same shape defined before it
    (`earlier`: name -> shape, in definition order)."""
    ops = _operands(m["args"])
    for i, op in enumerate(ops):
        name = op.split()[-1]
        same = [o for o, shape in earlier.items() if shape == earlier.get(name) and o != name]
        if same:
            new = list(ops)
            new[i] = op.replace(name, same[-1])
            yield line.replace(f"({m['args']})", f"({', '.join(new)})", 1)
            return


LINE_MUTATORS: dict[str, Callable[[re.Match, str], Iterator[str]]] = {
    "opcode": _opcode_swaps, "operand-order": _operand_swaps, "constant": _constant_bumps,
    "groups": _group_changes, "dropped-all-reduce": _dropped_collectives, "slice": _slice_shifts,
    "direction": _directions, "dimensions": _dimension_swaps,
}


def mutations(text: str) -> list[Mutation]:
    """Every mutation of the module, in file order."""
    out: list[Mutation] = []
    earlier: dict[str, str] = {}
    for no, line in enumerate(text.splitlines(), 1):
        if line.rstrip().endswith("{") or line.strip() == "}":
            earlier = {}   # a new computation: its own names
            continue
        m = INSTR.match(line)
        if not m:
            continue
        for kind, mutate in LINE_MUTATORS.items():
            out.extend(Mutation(kind, no, new) for new in mutate(m, line) if new != line)
        out.extend(Mutation("wrong-operand", no, new) for new in _wrong_operands(m, line, earlier)
                   if new != line)
        earlier["%" + m["name"] if "%" in m["head"] else m["name"]] = m["shape"]
    return out


def _claims_hold(seq: Path, mutant: Path, res) -> tuple[bool, str]:
    """Whether the verified mutant computes, on random inputs, each output the verdict
    reconstructs: the module as read (no rewrite), the verdict's input relations."""
    fresh = hlo_problem(seq, mutant, None, None, IdAllocator())
    relate_elided_constants(fresh)   # as the verdict did: equal random values on both sides
    claimed = res.problem
    if len(claimed.inputs) != len(fresh.inputs):
        return False, "the verdict's inputs are not the module's: not checked"
    fresh.inputs = list(claimed.inputs)
    rels = [claimed.outputs[i] or infer_output_relation(claimed, i, res.views)
            for i in range(len(fresh.seq.outputs))]
    if None in rels:
        return False, f"output {rels.index(None)}: verified with no relation"
    for seed in SEEDS:
        run = run_both(fresh, seed=seed)
        for idx, (s, d, rel) in enumerate(zip(fresh.seq.outputs, fresh.dist.outputs, rels)):
            want_all = np.asarray(run.seq[s][0], dtype=np.float64)
            for r in range(fresh.mesh.size):
                got = np.asarray(run.dist[d][r], dtype=np.float64)
                want = want_all[tuple(slice(o, o + n) for o, n in zip(rel.offsets[r], got.shape))]
                err = value_error(got, want)
                if err > TOL * max(1.0, float(np.max(np.abs(want))) if want.size else 0.0):
                    where = f"output {idx} rank {r}, seed {seed}"
                    if np.isfinite(got).all() and np.isfinite(want).all():
                        return False, f"{where}: off by {err:.3g}"
                    return False, f"{where}: {NONFINITE}"
    return True, ""


def run_mutant(pair: str, kept: Path, text: str, mut: Mutation, work: Path,
               side: str = "dist") -> Outcome:
    """Verify the pair with `side`'s module (whose text is `text`) mutated by `mut`
    and the other module `kept` as it is."""
    lines = text.splitlines()
    lines[mut.line - 1] = mut.text
    path = work / f"{pair}.{side}.mut{mut.line}.{mut.kind}.hlo"
    path.write_text("\n".join(lines) + "\n")
    seq, dist = (kept, path) if side == "dist" else (path, kept)
    t0 = time.perf_counter()
    try:
        res = verify_hlo(seq, dist)
    except InputError as e:
        return Outcome(pair, mut.kind, mut.line, "rejected", str(e).splitlines()[0][:160],
                       time.perf_counter() - t0)
    except Exception as e:   # noqa: BLE001 - every other exception is the finding
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return Outcome(pair, mut.kind, mut.line, "CRASH",
                       f"{type(e).__name__}: {e} ({Path(tb.filename).name}:{tb.lineno})"[:300],
                       time.perf_counter() - t0)
    seconds = time.perf_counter() - t0
    if not res.verified:
        return Outcome(pair, mut.kind, mut.line, "not verified", "", seconds)
    try:
        holds, why = _claims_hold(seq, dist, res)
    except NotExecutable as e:
        return Outcome(pair, mut.kind, mut.line, "skipped", f"not executable: {e}", seconds)
    if holds:
        return Outcome(pair, mut.kind, mut.line, "verified-equivalent", why, seconds)
    if why.endswith(NONFINITE):
        # equal over the reals, apart in floats (e.g. a softmax shifted by another value
        # than its max overflows): what a verdict means (shared/design/semantics.md), but listed
        return Outcome(pair, mut.kind, mut.line, "verified-nonfinite", why, seconds)
    return Outcome(pair, mut.kind, mut.line, "UNSOUND", why, seconds)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", type=Path, help="a folder of NAME.seq.hlo / NAME.dist.hlo pairs")
    ap.add_argument("--per-pair", type=int, default=10, help="mutants sampled per pair")
    ap.add_argument("--only", help="pairs whose name contains this")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--side", choices=("dist", "seq"), default="dist",
                    help="mutate the distributed module (default) or the sequential one")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    work = args.pairs / "mutants"
    work.mkdir(exist_ok=True)
    rng = random.Random(args.seed)
    outcomes: list[Outcome] = []
    for seq in sorted(args.pairs.glob("*.seq.hlo")):
        pair = seq.name[:-len(".seq.hlo")]
        dist = seq.with_name(f"{pair}.dist.hlo")
        if "_bug_" in pair or not dist.is_file() or (args.only and args.only not in pair):
            continue
        try:
            if not verify_hlo(seq, dist).verified:
                continue   # a false alarm already: its mutants say nothing
        except InputError:
            continue
        mutated, kept = (dist, seq) if args.side == "dist" else (seq, dist)
        text = mutated.read_text()
        muts = mutations(text)
        for mut in sorted(rng.sample(muts, min(args.per_pair, len(muts))), key=lambda m: m.line):
            o = run_mutant(pair, kept, text, mut, work, args.side)
            outcomes.append(o)
            if not args.json:
                print(f"{pair:44s} {o.kind:18s} line {o.line:4d} {o.result:20s} "
                      f"{o.seconds:5.1f}s {o.detail[:120]}", flush=True)
    counts = Counter(o.result for o in outcomes)
    bad = [o for o in outcomes if o.result in ("UNSOUND", "CRASH")]
    if args.json:
        print(json.dumps({"mutants": [asdict(o) for o in outcomes], "counts": dict(counts)}, indent=1))
    else:
        print("mutants: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for o in bad:
        print(f"{o.result}: {o.pair} line {o.line} ({o.kind}): {o.detail}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Library entry points for XLA HLO text: a pair of modules, or an XLA dump folder.

`verify_hlo(seq, dist, spec)` builds the Problem with `hlo_problem` (below),
relates the constants whose values both files elide (an assumption, listed),
and runs `dlverify.api.verify_problem`. When an output has no expected
relation (no `[outputs]` entry in the spec), it is inferred from the derived
views (`dlverify.outputs.infer_output_relations`) and listed under assumptions.

`verify_dump(dir)` pairs the modules of a folder written with `--xla_dump_to`:
per module, the module before optimisations (global shapes: the sequential
program) with the module after SPMD partitioning (dumped with
`--xla_dump_hlo_pass_re=spmd-partitioning`), else after optimisations (the
per-device program), and verifies each pair.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from dlverify.api import DEFAULT_WINDOW, verify_problem
from dlverify.engine import EngineName
from dlverify.errors import InputError
from dlverify.ir import Graph, IdAllocator, Op
from dlverify.problem import Problem
from dlverify.relations import replicated
from dlverify.spec import Spec, load_spec
from dlverify.verdict import Result

if TYPE_CHECKING:
    from dlverify.frontends.hlo import HloModule
    from dlverify.frontends.hlo.pairing import PairingRecord
    from dlverify.patterns import Pattern
    from dlverify.trial import Build


def read_hlo_module(path: str | Path) -> "HloModule":
    """Read and parse one HLO text file (InputError naming the file on failure)."""
    from dlverify.frontends.hlo import parse_hlo_module

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read HLO file: {e.strerror}", str(path)) from None
    except UnicodeDecodeError:
        raise InputError("not a text file (HLO text expected)", str(path)) from None
    return parse_hlo_module(text, str(path))


def hlo_problem(seq_path: str | Path, dist_path: str | Path, spec: Spec | None,
                ranks: int | None, ids: IdAllocator, *, custom_calls: dict | None = None,
                instruction_frames: bool = True,
                records: "PairingRecord | None" = None,
                choice: dict[int, int] | None = None) -> Problem:
    """The Problem of a sequential and a distributed (SPMD, one program per rank)
    HLO text file, paired by `frontends.hlo.pairing.pair_modules`: parameters
    by number, outputs by position in the ENTRY root tuple. `ranks`: the
    --ranks argument; else the spec's `ranks`; else the distributed module's
    num_partitions * replica_count. `instruction_frames`: ops are located at
    their instruction's line in the file first, then at the user frames of
    their metadata (see hlo_to_graph). `records`: filled with what the pairing
    decided (frontends.hlo.pairing.PairingRecord); `choice`: the candidate relation
    taken per parameter the shapes leave open (dlverify/trial.py)."""
    from dlverify.frontends.hlo.pairing import pair_modules

    seq_mod, dist_mod = read_hlo_module(seq_path), read_hlo_module(dist_path)
    return pair_modules(seq_mod, dist_mod, ids, ranks=ranks, spec=spec,
                        custom_calls=custom_calls, instruction_frames=instruction_frames,
                        name=f"{Path(seq_path).name} vs {Path(dist_path).name}", records=records,
                        choice=choice)


def relate_elided_constants(problem: Problem) -> None:
    """Constants whose values are elided (`{...}`) in both files, with the same
    instruction name, shape and dtype, become one more input of each program,
    related as replicas: an assumption, listed. Elided constants without such
    a twin stay unknown values (no view: nothing is derived from them)."""
    def elided(g: Graph) -> dict[tuple, list[Op]]:
        out: dict[tuple, list[Op]] = {}
        for op in g.ops:
            if op.kind == "constant" and op.params.get("value") is None:
                t = g.tensors[op.output]
                out.setdefault((op.name, t.shape, t.dtype), []).append(op)
        return out

    seq_c, dist_c = elided(problem.seq), elided(problem.dist)
    for key in sorted(set(seq_c) & set(dist_c), key=repr):
        s_ops, d_ops = seq_c[key], dist_c[key]
        if len(s_ops) != len(d_ops):
            continue  # instances cannot be paired one to one: leave them unknown
        name, shape, dtype = key
        for s_op, d_op in zip(s_ops, d_ops):
            for g, op in ((problem.seq, s_op), (problem.dist, d_op)):
                g.ops.remove(op)
                g.inputs.append(op.output)
                g.input_names.append(f"%{name}")
            problem.inputs.append(replicated(shape, problem.mesh.size))
        times = f" ({len(s_ops)} instances, paired in program order)" if len(s_ops) > 1 else ""
        problem.assumptions.append(f"constant %{name} elided in both files; assumed equal{times}")
    for side, consts, g in (("sequential", seq_c, problem.seq), ("distributed", dist_c, problem.dist)):
        left = {op.id for op in g.ops}    # the ones not made inputs above
        unknown = [op for ops in consts.values() for op in ops if op.id in left]
        for op in unknown[:5]:   # what reads them cannot relate: say which they are
            problem.unknowns.append(
                f"constant %{op.name} ({Path(op.loc.file).name}:{op.loc.line}) is elided ({{...}}) in "
                f"the {side} file and has no elided twin in the other: an unknown value that relates "
                f"to nothing (dump with --xla_dump_large_constants=true)")
        if len(unknown) > 5:
            problem.unknowns.append(f"... and {len(unknown) - 5} more elided constants in the {side} file")


def verify_hlo(seq_path: str | Path, dist_path: str | Path, spec_path: str | Path | None = None,
               ranks: int | None = None, engine: EngineName = "auto",
               window: int = DEFAULT_WINDOW, custom_calls: str | Path | dict | None = None,
               keep_facts: Path | None = None, cache_dir: Path | None = None,
               rules_dir: Path | None = None, patterns: Sequence[Pattern] | None = None) -> Result:
    """Prove that the distributed (SPMD, per-rank) HLO module computes what the
    sequential one computes. `spec_path`: the relation spec TOML (see
    dlverify/spec.py); `ranks` overrides its rank count; `custom_calls`: a
    custom-call registry file merged over the built-in one (or a loaded registry);
    `cache_dir`: the on-disk segment memo (dlverify/memo.py), off when None;
    `rules_dir`: another rule set (a folder with a main.dl), checked against the schema;
    `patterns`: the bug patterns matched on a failure (None: the shipped ones)."""
    from dlverify.trial import verify_by_trial

    t0 = time.perf_counter()
    spec = load_spec(spec_path) if spec_path is not None else None
    registry = _registry(custom_calls)
    spec_seconds = time.perf_counter() - t0

    def verify(problem: Problem, build_seconds: float) -> Result:
        return verify_problem(problem, engine=engine, window=window, keep_facts=keep_facts,
                              timings={"parse": spec_seconds + build_seconds},
                              cache_dir=cache_dir, rules_dir=rules_dir, patterns=patterns)
    return verify_by_trial(hlo_builder(seq_path, dist_path, spec, ranks, registry), verify).result


def hlo_builder(seq_path: str | Path, dist_path: str | Path, spec: Spec | None,
                ranks: int | None, custom_calls: dict | None) -> "Build":
    """build(choice, records): the Problem of the pair under that choice of candidate
    relations (dlverify/trial.py), its elided constants related; what `verify_hlo`
    and `dlverify spec` verify."""
    def build(choice: dict[int, int], records: "PairingRecord") -> Problem:
        problem = hlo_problem(seq_path, dist_path, spec, ranks, IdAllocator(),
                              custom_calls=custom_calls, records=records, choice=choice)
        relate_elided_constants(problem)
        return problem
    return build


def _registry(custom_calls: str | Path | dict | None) -> dict | None:
    if custom_calls is None or isinstance(custom_calls, dict):
        return custom_calls
    from dlverify.frontends.custom_calls import load_registry
    return load_registry(custom_calls)


# ---------------------------------------------------------------------------
# XLA dump folders

_MODULE = re.compile(r"^(module_\d+\.[^.]+(?:\.[^.]+)*?)\.(.+)\.txt$")
_AFTER_SPMD = re.compile(r"(^|\.)after_spmd-partitioning(\.|$)")
_AFTER_OPT = re.compile(r"(^|_)after_optimizations$")


@dataclass
class DumpModule:
    """The files of one module of an XLA dump folder."""

    name: str                       # e.g. "module_0014.jit_model"
    before: Path                    # before optimisations: global shapes
    after: Path | None              # after SPMD partitioning, else after optimisations
    stage: str                      # "after SPMD partitioning" | "after optimizations"


def verify_dump_module(mod: DumpModule, engine: EngineName = "auto", window: int = DEFAULT_WINDOW,
                       custom_calls: str | Path | dict | None = None,
                       cache_dir: Path | None = None, rules_dir: Path | None = None,
                       patterns: Sequence[Pattern] | None = None) -> Result | None:
    """One module of a dump folder (see verify_dump); None when it has no
    per-device module or was not partitioned (one device). On its own so that
    `check-dump --jobs N` verifies the modules in separate processes."""
    from dlverify.frontends.hlo import root_output_relations
    from dlverify.frontends.hlo.pairing import pair_modules

    if mod.after is None:
        return None
    t0 = time.perf_counter()
    dist_mod = read_hlo_module(mod.after)
    n = (dist_mod.num_partitions or 1) * (dist_mod.replica_count or 1)
    if n <= 1:
        return None
    seq_mod = read_hlo_module(mod.before)
    problem = pair_modules(seq_mod, dist_mod, IdAllocator(), ranks=n,
                           expected_outputs=root_output_relations(seq_mod, n),
                           custom_calls=_registry(custom_calls), instruction_frames=True,
                           name=f"{mod.name} (before optimizations vs {mod.stage})")
    relate_elided_constants(problem)
    return verify_problem(problem, engine=engine, window=window,
                          timings={"parse": time.perf_counter() - t0}, cache_dir=cache_dir,
                          rules_dir=rules_dir, patterns=patterns)


def no_partitioned_module(dump_dir: str | Path) -> InputError:
    return InputError("no SPMD-partitioned module in this folder (dump a program jitted "
                      "with shardings over several devices)", str(dump_dir))


def dump_modules(dump_dir: str | Path) -> list[DumpModule]:
    """Pair the files of an `--xla_dump_to` folder by module. Modules without a
    per-device module (never partitioned) have `after` None."""
    d = Path(dump_dir)
    if not d.is_dir():
        raise InputError("not a directory (expected an XLA dump folder written with "
                         "--xla_dump_to)", str(d))
    stages: dict[str, dict[str, Path]] = {}
    for f in sorted(d.iterdir()):
        m = _MODULE.match(f.name)
        if m is None:
            continue
        name, stage = m.group(1), m.group(2)
        if stage == "before_optimizations":
            stages.setdefault(name, {})["before"] = f
            continue
        # pass dumps are "<name>.<NNNN>.<pipeline>.after_<pass>.before_<next>"
        pm = re.match(r"(.*?)\.(\d{4})\.(.+)$", f"{name}.{stage}")
        if pm is not None and _AFTER_SPMD.search(pm.group(3)):
            stages.setdefault(pm.group(1), {})["spmd"] = f
        elif _AFTER_OPT.search(stage):
            stages.setdefault(name, {})["opt"] = f
    _pair_renumbered(stages)
    out = []
    for name, st in sorted(stages.items()):
        if "before" not in st:
            continue
        after = st.get("spmd") or st.get("opt")
        stage = "after SPMD partitioning" if "spmd" in st else "after optimizations"
        out.append(DumpModule(name, st["before"], after, stage))
    if not out:
        raise InputError("no module dumped before optimisations (files "
                         "module_*.before_optimizations.txt) in this folder", str(d))
    return out


_HEADER_PARAMS = re.compile(r"entry_computation_layout=\{\((.*?)\)->")
_ARRAY = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
_PARTITIONS = re.compile(r"num_partitions=(\d+)")
# A module header's ENTRY parameters (dtype, shape) and partition count.
Fingerprint = tuple[tuple[tuple[str, tuple[int, ...]], ...], int]


def _fingerprint(path: Path) -> Fingerprint | None:
    """The ENTRY parameters (dtype, shape) and partition count a module's header
    declares, or None when the header does not say (read from the first line only)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            head = f.readline(1 << 20)
    except OSError:
        return None
    m = _HEADER_PARAMS.search(head)
    if m is None:
        return None
    params = tuple((dt, tuple(int(x) for x in dims.split(",") if x))
                   for dt, dims in _ARRAY.findall(m.group(1)))
    parts = _PARTITIONS.search(head)
    return params, int(parts.group(1)) if parts else 1


def _fits(fb: Fingerprint | None, fa: Fingerprint | None) -> bool:
    """Whether the per-device module of fingerprint `fa` can be the partitioned module
    of `fb`: the same parameter count and dtypes, each shape the global one or a block
    the partition count allows (param_infer.shapes_compatible)."""
    from dlverify.frontends.hlo.param_infer import shapes_compatible

    if fb is None or fa is None or len(fb[0]) != len(fa[0]):
        return False
    n = fa[1]
    return all(db == da and shapes_compatible(sb, sa, n)
               for (db, sb), (da, sa) in zip(fb[0], fa[0]))


def _pair_renumbered(stages: dict[str, dict[str, Path]]) -> None:
    """A module whose files before and after optimisation carry different numbers
    (`module_0003.jit_f` and `module_0007.jit_f`: XLA gave the compiled module a new
    id) is paired by its program name, when exactly one unpaired module of that name
    has each side; among several of one name, by their fingerprints (parameter
    dtypes and shapes, `_fits`) when these pair them one to one; the rest stay apart."""
    def program(name: str) -> str:
        return name.split(".", 1)[1] if "." in name else name
    befores: dict[str, list[str]] = {}
    afters: dict[str, list[str]] = {}
    for name, st in stages.items():
        if "before" in st and not {"spmd", "opt"} & set(st):
            befores.setdefault(program(name), []).append(name)
        elif "before" not in st:
            afters.setdefault(program(name), []).append(name)
    for prog, names in befores.items():
        other = afters.get(prog, [])
        if len(names) == 1 and len(other) == 1:
            stages[names[0]].update(stages.pop(other[0]))
            continue
        prints = {a: _fingerprint(_after_file(stages[a])) for a in other}   # each file once
        after_of: dict[str, list[str]] = {}
        for b in names:
            fb = _fingerprint(stages[b]["before"])
            after_of[b] = [a for a in other if _fits(fb, prints[a])]
        taken = [a for fits in after_of.values() for a in fits]
        for b, fits in after_of.items():
            if len(fits) == 1 and taken.count(fits[0]) == 1:
                stages[b].update(stages.pop(fits[0]))


def _after_file(stage: dict[str, Path]) -> Path:
    return stage.get("spmd") or stage["opt"]


def verify_dump(dump_dir: str | Path, engine: EngineName = "auto", window: int = DEFAULT_WINDOW,
                custom_calls: str | Path | dict | None = None,
                cache_dir: Path | None = None,
                rules_dir: Path | None = None,
                patterns: Sequence[Pattern] | None = None) -> list[tuple[str, Result]]:
    """One verdict per SPMD-partitioned module of an XLA dump folder: the module
    before optimisations (the sequential program, global shapes) against the
    module after SPMD partitioning (dump with
    `--xla_dump_hlo_pass_re=spmd-partitioning`), else after optimisations.
    Input relations come from the partitioned module's parameter shardings,
    expected output relations from the root sharding before optimisations
    (inferred from the views where there is none). Modules that were not
    partitioned (one device) are left out. `cache_dir`: the on-disk segment
    memo (dlverify/memo.py), shared by the modules; off when None. `rules_dir`: another
    rule set (a folder with a main.dl). `patterns`: as for verify_hlo."""
    registry = _registry(custom_calls)
    results = []
    for mod in dump_modules(dump_dir):
        res = verify_dump_module(mod, engine, window, registry, cache_dir, rules_dir, patterns)
        if res is not None:
            results.append((mod.name, res))
    if not results:
        raise no_partitioned_module(dump_dir)
    return results

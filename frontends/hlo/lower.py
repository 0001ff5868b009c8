"""`HloModule` -> IR `Graph`.

`hlo_to_graph(module, ids, name)` translates the ENTRY computation into a
`Graph` of IR ops (vocabulary `dlverify.ir.OPS`, params exactly as
`frontends/jaxpr.py` gives them), inlining fusions, calls and statically
unrollable while loops, resolving tuples, expanding custom calls through the
registry `dlverify/custom_calls.toml`, and turning `partition-id` /
`replica-id` into `axis_index` over the single mesh axis `_flat` (rank =
global device id). Each opcode's translation is a handler in
frontends/hlo/ops/ (one module per family); an opcode without one is an
`UnknownOpError`, never an identity.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dlverify.errors import InputError, UnknownOpError
from dlverify.frontends.hlo.attributes import (HloSharding, parse_metadata, parse_replica_groups,
                                               parse_sharding)
from dlverify.frontends.hlo.fold import KNOWN_LIMIT, eval_small
from dlverify.frontends.hlo.model import (MAX_RANKS, HloComputation, HloInstruction, HloModule,
                                          HloShape, np_dtype)
from dlverify.frontends.hlo.moved_metadata import MovedMetadata
from dlverify.frontends.hlo.ops import HANDLERS, Val
from dlverify.frontends.hlo.parse import single_line
from dlverify.ir import Frame, Graph, GraphBuilder, IdAllocator, SourceLoc, is_float_dtype
from dlverify.relations import BlockRelation

# Calls, fusions and branches nest: each level is one Python frame of
# `run_comp`, and a computation calling itself would never end.
MAX_CALL_DEPTH = 200

_LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/torch_neuronx/|/_pytest/|/pluggy/|"
                           r"/lib/python3\.\d+/(?!site-packages)")


@dataclass
class HloParam:
    number: int
    name: str
    shape: tuple[int, ...]
    dtype: str
    tensor: int
    line: int
    sharding: HloSharding | None = None
    relation: BlockRelation | None = None  # the tile each device holds, if annotated
    op_name: str = ""                      # its metadata op_name (a name the framework gave it)


@dataclass
class HloInfo:
    """What `hlo_to_graph` learned besides the graph."""

    params: list[HloParam]                        # by parameter number
    outputs: list[tuple[tuple[int, ...], str]]    # shapes/dtypes of the flattened root
    num_partitions: int | None
    replica_count: int | None
    ranks: int                                    # size of the `_flat` axis used for groups
    assumptions: list[str] = field(default_factory=list)
    output_shardings: list[HloSharding | None] = field(default_factory=list)  # from the root
    custom_calls: dict[str, int] = field(default_factory=dict)  # target -> count


class Lowerer:
    def __init__(self, module: HloModule, b: GraphBuilder, ranks: int | None,
                 registry: dict[str, Any] | None, instruction_frames: bool = False) -> None:
        self.m = module
        self.instruction_frames = instruction_frames
        self.b = b
        self.file = module.file
        self.R = module.replica_count or 1
        self.P = module.num_partitions or 1
        self.ranks = ranks if ranks is not None else self.R * self.P
        if not 1 <= self.ranks <= MAX_RANKS:
            raise InputError(f"{self.ranks} ranks: the supported range is 1..{MAX_RANKS}",
                             module.file, module.entry.line)
        self.call_depth = 0
        if registry is None:
            from dlverify.frontends.custom_calls import builtin_registry
            registry = builtin_registry()
        self.registry = registry
        self.known: dict[int, np.ndarray] = {}
        self.assumptions: list[str] = []
        self.custom_calls: dict[str, int] = {}
        # positions a variadic reduce-window selected, for the scatter that places by them
        # (frontends/hlo/ops/window_select.py): tensor -> (its selection, which position)
        self.window_selections: dict[int, tuple[Any, int]] = {}
        # Set only while a sort comparator is lowered to be evaluated on probe
        # values (frontends/hlo/comparator.py): bit reinterpretations
        # (bitcast-convert) become the evaluable, rule-less `bitcast_convert`
        # and total-order compares are spelled out; in a program they stay
        # unknown ops.
        self.bit_reinterpretation = False
        self.comparator_orders: dict[tuple[str, tuple[str, ...]], Any] = {}
        self._frame_cache: dict[int, tuple[Frame, ...]] = {}
        self._source_cache: dict[tuple[str, str], tuple[Frame, ...]] = {}
        self._moved = MovedMetadata(module)
        fr = module.frames.stack_frames
        # Some printers write parent_frame_id one above the proto value (frame 1
        # then names itself as its parent); 0 always means "no parent".
        self._parent_offset = 1 if any(p >= f for f, (_, p) in fr.items()) else 0

    # -- helpers -----------------------------------------------------------

    def err(self, ins: HloInstruction, msg: str) -> InputError:
        return InputError(f"{ins.name}: {msg}", self.file, ins.line)

    def unknown(self, ins: HloInstruction, msg: str) -> UnknownOpError:
        return UnknownOpError(f"{ins.name}: {msg}", self.file, ins.line)

    def assume(self, text: str) -> None:
        if text not in self.assumptions:
            self.assumptions.append(text)

    def tid(self, ins: HloInstruction, v: Val, what: str = "operand") -> int:
        if isinstance(v, (int, np.integer)):
            return int(v)
        raise self.err(ins, f"{what} is a {'tuple' if isinstance(v, tuple) else 'token'}, "
                            f"expected an array")

    def shape_of(self, t: int) -> tuple[int, ...]:
        return self.b.graph.tensors[t].shape

    def dtype_of(self, t: int) -> str:
        return self.b.graph.tensors[t].dtype

    def array_shape(self, ins: HloInstruction) -> HloShape:
        if ins.shape.is_tuple:
            raise self.err(ins, f"expected an array result, the instruction declares {ins.shape}")
        return ins.shape

    def _stack(self, fid: int) -> tuple[Frame, ...]:
        if fid in self._frame_cache:
            return self._frame_cache[fid]
        t = self.m.frames
        out, seen, cur = [], set(), fid
        while cur and cur in t.stack_frames and cur not in seen:
            seen.add(cur)
            loc_id, parent = t.stack_frames[cur]
            if loc_id in t.file_locations:
                file_id, fn_id, line = t.file_locations[loc_id]
                out.append(Frame(t.file_names.get(file_id, ""), line, t.function_names.get(fn_id, "")))
            cur = parent - self._parent_offset
        frames = _user_frames(out)
        self._frame_cache[fid] = frames
        return frames

    def loc(self, ins: HloInstruction, outer: SourceLoc | None,
            comp: HloComputation | None = None) -> SourceLoc:
        """Where `ins` comes from: the user frames of its metadata (else those of the
        instruction calling its computation, else those of the reader XLA moved its
        metadata to); with `instruction_frames`, the instruction's own line in the HLO
        file comes first."""
        loc = self._user_loc(ins, outer)
        if comp is not None and loc.frames == (Frame(self.file, ins.line, ins.name),):
            loc = self._moved_loc(ins, comp) or loc
        if not self.instruction_frames:
            return loc
        here = Frame(self.file, ins.line, ins.name)
        return SourceLoc((here,) + tuple(f for f in loc.frames if f != here), loc.op_name)

    def _user_loc(self, ins: HloInstruction, outer: SourceLoc | None) -> SourceLoc:
        md = ins.attrs.get("metadata")
        frames: tuple[Frame, ...] = ()
        op_name = ""
        if md:
            val = parse_metadata(md)
            op_name = val.get("op_name", "")
            if "stack_frame_id" in val:
                try:
                    frames = self._stack(int(val["stack_frame_id"]))
                except ValueError:
                    frames = ()
            if not frames and val.get("source_file"):
                key = (val["source_file"], val.get("source_line", "0"))
                if key not in self._source_cache:  # many instructions share one stack
                    self._source_cache[key] = _source_file_frames(*key)
                frames = self._source_cache[key]
        if frames or op_name:
            if not frames and outer is not None and outer.frames:
                frames = outer.frames
            return SourceLoc(frames, op_name)
        if outer is not None and (outer.frames or outer.op_name):
            return outer
        return SourceLoc((Frame(self.file, ins.line, ins.name),), "")

    def _moved_loc(self, ins: HloInstruction, comp: HloComputation) -> SourceLoc | None:
        """An instruction without metadata whose metadata XLA moved to a layout-only
        reader (frontends/hlo/moved_metadata.py): its own line, then that reader's
        line in the module, labelled, then the reader's user frames."""
        found = self._moved.holder(ins, comp)
        if found is None:
            return None
        reader, md = found
        try:
            user = self._stack(int(md["stack_frame_id"]))
        except ValueError:
            return None
        if not user:
            return None
        label = Frame(self.file, reader.line, f"metadata of %{reader.name}")
        # no op_name of its own: the reader's names the primitive, not this instruction's kind
        return SourceLoc((Frame(self.file, ins.line, ins.name), label) + user, "")

    def emit(self, kind: str, inputs: list[int], shape: tuple[int, ...], dtype: str,
             params: dict | None, loc: SourceLoc, name: str) -> int:
        out = self.b.op(kind, inputs, shape, dtype, params, loc, name)
        self._fold(kind, inputs, out, params or {})
        return out

    def _fold(self, kind: str, inputs: list[int], out: int, params: dict) -> None:
        """Track small values known statically (loop counters, reduce inits)."""
        if not all(i in self.known for i in inputs):
            return
        shape = self.shape_of(out)
        if int(np.prod(shape)) > KNOWN_LIMIT:
            return
        xs = [self.known[i] for i in inputs]
        try:
            v = eval_small(kind, xs, shape, params, self.dtype_of(out))
        except Exception:  # noqa: BLE001 - folding is best effort
            v = None
        if v is not None:
            self.known[out] = np.asarray(v).reshape(shape)

    # -- computations ------------------------------------------------------

    def run_comp(self, comp: HloComputation, args: list[Val], outer: SourceLoc | None,
                 caller: HloInstruction | None = None) -> Val:
        params = comp.parameters()
        if sorted(params) != list(range(len(args))):
            where = caller or comp.root
            raise InputError(f"computation {comp.name} takes parameters {sorted(params)} but is "
                             f"called with {len(args)} operands", self.file, where.line)
        if self.call_depth >= MAX_CALL_DEPTH:
            where = caller or comp.root
            raise InputError(f"computation {comp.name} is called {MAX_CALL_DEPTH} levels deep "
                             f"(recursive calls?)", self.file, where.line)
        self.call_depth += 1
        try:
            return self._run_instructions(comp, args, outer)
        finally:
            self.call_depth -= 1

    def _run_instructions(self, comp: HloComputation, args: list[Val],
                          outer: SourceLoc | None) -> Val:
        env: dict[str, Val] = {}
        for ins in comp.instructions:
            if ins.opcode == "parameter":
                env[ins.name] = args[int(ins.raw_operands)]
                continue
            vals = [env[o] for o in ins.operands]
            env[ins.name] = self.lower(ins, vals, comp, outer)
        return env[comp.root.name]

    def lower(self, ins: HloInstruction, ops: list[Val], comp: HloComputation,
              outer: SourceLoc | None) -> Val:
        op = ins.opcode
        loc = self.loc(ins, outer, comp)
        fn = HANDLERS.get(op)
        if fn is None:
            raise self.unknown(ins, f"no translation for HLO opcode '{op}' (frontends/hlo/ops/)")
        try:
            return fn(self, ins, ops, comp, loc)
        except (KeyError, ValueError, IndexError, TypeError) as e:
            # A malformed instruction the handler did not anticipate: still
            # one line naming the instruction, never a traceback.
            raise self.err(ins, f"malformed {op} instruction ({type(e).__name__}: {e})") from e

    def scalar(self, value: float, dtype: str, loc: SourceLoc, name: str) -> int:
        """A known scalar constant (exact in `dtype`): a literal of an expansion."""
        val = np.array(value, dtype=np_dtype(dtype))
        c = self.b.constant(val, (), dtype, loc, name)
        self.known[c] = val
        return c

    def splat(self, value: float, shape: tuple[int, ...], dtype: str, loc: SourceLoc,
              name: str) -> int:
        """A known scalar constant (exact in `dtype`) broadcast to `shape`: the
        literals of expansions (custom calls, batch norms)."""
        c = self.scalar(value, dtype, loc, name)
        return self.emit("broadcast_in_dim", [c], shape, dtype, {"broadcast_dimensions": ()}, loc,
                         name)

    def elementwise(self, ins: HloInstruction, kind: str, ops: list[Val], loc: SourceLoc,
                    params: dict | None = None) -> int:
        sh = self.array_shape(ins)
        ts = [self.tid(ins, v) for v in ops]
        return self.emit(kind, ts, sh.dims, sh.dtype, params, loc, ins.name)

    # -- groups ------------------------------------------------------------

    def _flatten_ids(self, ins: HloInstruction, groups: list[list[int]]) -> list[list[int]]:
        """Map replica/partition ids of a collective onto global device ids
        (rank = replica * num_partitions + partition)."""
        R, P = self.R, self.P
        if R > 1 and P > 1 and ins.attrs.get("use_global_device_ids", "false") != "true":
            if "channel_id" in ins.attrs:   # groups of partitions, in each replica
                return [[r * P + p for p in g] for r in range(R) for g in groups]
            return [[r * P + p for r in g] for p in range(P) for g in groups]  # of replicas
        return groups

    def groups(self, ins: HloInstruction) -> list[list[int]]:
        try:
            groups = parse_replica_groups(ins.attrs.get("replica_groups"))
        except ValueError as e:
            raise self.err(ins, f"replica_groups: {e}") from None
        if groups is None:
            groups = [list(range(self.ranks))]
        else:
            groups = self._flatten_ids(ins, groups)
        seen: set[int] = set()
        for g in groups:
            for r in g:
                if r < 0 or r >= self.ranks:
                    raise self.err(ins, f"replica group member {r} is outside the {self.ranks} "
                                        f"ranks (set the rank count: --ranks or num_partitions)")
                if r in seen:
                    raise self.err(ins, f"rank {r} appears in two replica groups")
                seen.add(r)
        return groups

    def reducer(self, ins: HloInstruction, allowed: dict[str, str], attr: str = "to_apply") -> str:
        """The reduction a `to_apply` (or `attr`) computation performs, by its root opcode."""
        cname = (ins.attrs.get(attr) or "").lstrip("%")
        comp = self.m.computations.get(cname)
        if comp is None:
            raise self.err(ins, f"no {attr} reducer computation")
        op = _reducer_opcode(comp)
        if op is None or op not in allowed:
            what = op or "a computation that is not one binary op of its two parameters"
            raise self.unknown(ins, f"reducer %{cname} computes {what}; supported: "
                                    f"{', '.join(sorted(allowed))}")
        return allowed[op]


def _user_frames(frames: list[Frame]) -> tuple[Frame, ...]:
    """Drop library frames (site-packages, torch_neuronx, pytest); keep all if
    that would leave none."""
    kept = [f for f in frames if not _LIBRARY_PATH.search(f.file)]
    return tuple(kept if kept else frames)


def _source_file_frames(source_file: str, source_line: str) -> tuple[Frame, ...]:
    """`source_file` is a path, or (torch-neuronx) "path\\n----\\n['p:l', ...]":
    a Python stack, outermost first."""
    if "\n----\n" in source_file:
        _, stack = source_file.split("\n----\n", 1)
        entries = re.findall(r"'([^']*):(\d+)'", stack)
        if entries:
            frames = [Frame(p, int(l)) for p, l in reversed(entries)]
            return _user_frames(frames)
        source_file = source_file.split("\n----\n", 1)[0]
    try:
        line = int(source_line)
    except ValueError:
        line = 0
    return (Frame(source_file, line),)


def _reducer_opcode(comp: HloComputation) -> str | None:
    """The opcode of a reducer `f(p0, p1) = op(p0, p1)`, looking through
    float-to-float converts."""
    params = comp.parameters()
    if len(params) != 2:
        return None
    pnames = {params[0].name, params[1].name}

    def strip(name: str) -> str:
        ins = comp.by_name[name]
        while ins.opcode == "convert" and not ins.shape.is_tuple and is_float_dtype(ins.shape.dtype):
            src = comp.by_name[ins.operands[0]]
            if src.shape.is_tuple or not is_float_dtype(src.shape.dtype):
                break
            ins = src
        return ins.name

    root = comp.by_name[strip(comp.root.name)]
    if root.opcode == "parameter" and root.name == params[1].name:
        return "overwrite"   # f(p0, p1) = p1: a scatter's `set`
    if len(root.operands) != 2:
        return None
    if {strip(o) for o in root.operands} != pnames:
        return None
    return root.opcode



def _flatten(v: Val) -> list[Val]:
    """The leaves of a (nested) tuple value, left to right, without recursion."""
    out: list[Val] = []
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, tuple):
            stack.extend(reversed(x))
        else:
            out.append(x)
    return out


@single_line
def hlo_to_graph(module: HloModule, ids: IdAllocator, name: str, *, ranks: int | None = None,
                 custom_calls: dict[str, Any] | None = None,
                 instruction_frames: bool = False) -> tuple[Graph, HloInfo]:
    """Translate the ENTRY computation of `module` into a Graph.

    `ranks` is the number of ranks of the flat axis (used for `replica_groups={}`
    and to check group members); default num_partitions * replica_count.
    `custom_calls` is a registry from `frontends.custom_calls.load_registry`
    (default: the built-in dlverify/custom_calls.toml). With
    `instruction_frames`, every op's innermost frame is its instruction's line
    in the HLO file (named by the instruction), followed by the user frames of
    its metadata: for HLO files a user wrote or dumped, where reports point."""
    graph = Graph(name)
    b = GraphBuilder(graph, ids)
    L = Lowerer(module, b, ranks, custom_calls, instruction_frames)
    entry = module.entry
    pins = entry.parameters()
    if sorted(pins) != list(range(len(pins))):
        raise InputError(f"ENTRY parameters are numbered {sorted(pins)}, not 0..{len(pins) - 1}",
                         module.file, entry.line)
    params: list[HloParam] = []
    args: list[Val] = []
    for k in range(len(pins)):
        ins = pins[k]
        if ins.shape.is_tuple:
            raise UnknownOpError(f"{ins.name}: tuple-shaped ENTRY parameters are not supported",
                                 module.file, ins.line)
        t = b.tensor(ins.shape.dims, ins.shape.dtype, ins.name)
        sharding = None
        relation = None
        if "sharding" in ins.attrs:
            try:
                sharding = parse_sharding(ins.attrs["sharding"])
            except ValueError as e:
                raise InputError(f"{ins.name}: {e}", module.file, ins.line) from None
            relation = sharding.relation(ins.shape.dims, module.partitioned,
                                         L.ranks if L.ranks > 1 else None)
        md = ins.attrs.get("metadata")
        op_name = parse_metadata(md).get("op_name", "") if md else ""
        params.append(HloParam(k, ins.name, ins.shape.dims, ins.shape.dtype, t, ins.line,
                               sharding, relation, op_name))
        args.append(t)
    graph.inputs = [p.tensor for p in params]
    graph.input_names = [f"param{p.number}" for p in params]
    root = L.run_comp(entry, args, None)
    outs = _flatten(root)
    for i, v in enumerate(outs):
        if not isinstance(v, (int, np.integer)):
            raise InputError(f"ENTRY result element {i} is not an array", module.file,
                             entry.root.line)
    graph.outputs = [int(v) for v in outs]
    graph.output_names = [f"out{i}" for i in range(len(outs))]
    out_sh: list[HloSharding | None] = [None] * len(outs)
    if "sharding" in entry.root.attrs:
        try:
            sh = parse_sharding(entry.root.attrs["sharding"])
        except ValueError as e:
            raise InputError(f"{entry.root.name}: {e}", module.file, entry.root.line) from None
        if sh.kind == "tuple" and len(sh.elements) == len(outs):
            out_sh = list(sh.elements)
        elif sh.kind != "tuple":
            out_sh = [sh] * len(outs)
    info = HloInfo(params, [(graph.tensors[t].shape, graph.tensors[t].dtype) for t in graph.outputs],
                   module.num_partitions, module.replica_count, L.ranks,
                   assumptions=list(L.assumptions), output_shardings=out_sh,
                   custom_calls=dict(L.custom_calls))
    return graph, info


def root_output_relations(module: HloModule, ranks: int) -> list[BlockRelation | None]:
    """The relation of each (flattened) ENTRY output given by the ROOT's
    `sharding=` annotation in a module with global shapes (before SPMD
    partitioning); None for an output whose sharding is absent or not a set of
    even blocks over ranks 0..ranks-1."""
    root = module.entry.root
    shapes = [leaf.dims for leaf in root.shape.leaves()]
    text = root.attrs.get("sharding")
    if text is None:
        return [None] * len(shapes)
    try:
        sh = parse_sharding(text)
    except ValueError as e:
        raise InputError(f"{root.name}: {e}", module.file, root.line) from None
    per = list(sh.elements) if sh.kind == "tuple" else [sh] * len(shapes)
    if len(per) != len(shapes):
        return [None] * len(shapes)
    return [s.relation(shape, local=False, ranks=ranks) for s, shape in zip(per, shapes)]

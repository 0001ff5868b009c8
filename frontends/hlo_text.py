"""XLA HLO text -> IR.

Two stages:

* `parse_hlo_module(text, file)` reads the textual HLO format (as printed by
  `HloModule::ToString`, `jax.jit(f).lower(..).as_text(dialect="hlo")`,
  `compiled.as_text()` or an XLA dump) into a small typed structure:
  `HloModule` -> `HloComputation` -> `HloInstruction`, with shapes parsed,
  attributes kept as raw text, operands resolved by name and each computation
  in topological order. It copes with the old `api_version=...` attribute,
  `/*index=5*/` comments, layouts, `%` or bare names, and metadata strings of
  any length with escaped quotes. Malformed text (truncated file, unknown
  opcode, bad shape, undefined operand) is an `InputError` naming the file and
  the line of the offending instruction.

* `hlo_to_graph(module, ids, name)` translates the ENTRY computation into a
  `Graph` of IR ops (vocabulary `dlverify.ir.OPS`, params exactly as
  `frontends/jaxpr.py` gives them), inlining fusions, calls and statically
  unrollable while loops, resolving tuples, expanding custom calls through the
  registry `dlverify/custom_calls.toml`, and turning `partition-id` /
  `replica-id` into `axis_index` over the single mesh axis `_flat` (rank =
  global device id). An opcode without a translation is an `UnknownOpError`,
  never an identity.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from dlverify.errors import InputError, UnknownOpError
from dlverify.ir import Frame, Graph, GraphBuilder, IdAllocator, SourceLoc, is_float_dtype
from dlverify.relations import BlockRelation

FLAT_AXIS = "_flat"

# ---------------------------------------------------------------------------
# Element types

_DTYPES = {
    "pred": "bool", "s2": "int2", "s4": "int4", "s8": "int8", "s16": "int16", "s32": "int32",
    "s64": "int64", "u2": "uint2", "u4": "uint4", "u8": "uint8", "u16": "uint16",
    "u32": "uint32", "u64": "uint64", "f16": "float16", "bf16": "bfloat16", "f32": "float32",
    "f64": "float64", "c64": "complex64", "c128": "complex128",
    "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "f8e4m3fnuz": "float8_e4m3fnuz",
    "f8e5m2fnuz": "float8_e5m2fnuz", "f8e4m3b11fnuz": "float8_e4m3b11fnuz",
    "f8e4m3": "float8_e4m3", "f8e3m4": "float8_e3m4", "f8e8m0fnu": "float8_e8m0fnu",
    "f4e2m1fn": "float4_e2m1fn", "token": "token", "opaque": "opaque",
}


_is_float = is_float_dtype


def _np_dtype(dtype: str) -> Any:
    """The numpy dtype for an IR dtype name (ml_dtypes for the narrow floats)."""
    try:
        return np.dtype(dtype)
    except TypeError:
        pass
    try:
        import ml_dtypes  # shipped with jaxlib
        return np.dtype(getattr(ml_dtypes, dtype))
    except (ImportError, AttributeError, TypeError):
        return np.dtype(np.float64 if _is_float(dtype) else np.int64)


# Every opcode XLA prints (hlo_opcode.h), translated or not: anything else is a
# malformed file. `cross-replica-sum` is the old name of all-reduce.
_KNOWN_OPCODES = frozenset("""
abs add add-dependency after-all all-gather all-gather-done all-gather-start all-reduce
all-reduce-done all-reduce-start all-to-all and async-done async-start async-update atan2
batch-norm-grad batch-norm-inference batch-norm-training bitcast bitcast-convert broadcast
call cbrt ceil cholesky clamp clz collective-broadcast collective-permute
collective-permute-done collective-permute-start compare complex concatenate conditional
constant convert convolution copy copy-done copy-start cosine count-leading-zeros
cross-replica-sum custom-call divide domain dot dynamic-reshape dynamic-slice
dynamic-update-slice erf exponential exponential-minus-one fft floor fusion gather
get-dimension-size get-tuple-element imag infeed iota is-finite log log-plus-one logistic
map maximum minimum multiply negate not opt-barrier optimization-barrier or outfeed pad
parameter partition-id popcnt power ragged-all-to-all ragged-dot real recv recv-done reduce
reduce-precision reduce-scatter reduce-window remainder replica-id reshape reverse rng
rng-bit-generator rng-get-and-update-state round-nearest-afz round-nearest-even rsqrt
scaled-dot scatter select select-and-scatter send send-done set-dimension-size shift-left
shift-right-arithmetic shift-right-logical sign sine slice sort sqrt stochastic-convert
subtract tan tanh topk transpose triangular-solve tuple while xor
""".split())

# Attributes naming called computations.
_CALL_ATTRS = ("to_apply", "calls", "condition", "body", "true_computation",
               "false_computation", "branch_computations", "called_computations")


# ---------------------------------------------------------------------------
# Parsed structure


@dataclass(frozen=True)
class HloShape:
    """An array shape (`dtype` an IR dtype name such as "float32") or a tuple
    (`dtype` "tuple", `elements` set). `layout` is minor-to-major, None if not
    printed."""

    dtype: str
    dims: tuple[int, ...] = ()
    layout: tuple[int, ...] | None = None
    elements: tuple["HloShape", ...] = ()

    @property
    def is_tuple(self) -> bool:
        return self.dtype == "tuple"

    @property
    def minor_to_major(self) -> tuple[int, ...]:
        if self.layout is not None and len(self.layout) == len(self.dims):
            return self.layout
        return tuple(reversed(range(len(self.dims))))

    def leaves(self) -> list["HloShape"]:
        if not self.is_tuple:
            return [self]
        return [leaf for e in self.elements for leaf in e.leaves()]

    def __str__(self) -> str:
        if self.is_tuple:
            return "(" + ", ".join(str(e) for e in self.elements) + ")"
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass
class HloInstruction:
    name: str
    shape: HloShape
    opcode: str
    operands: list[str]          # operand instruction names (no `%`)
    raw_operands: str            # the text between the parentheses
    attrs: dict[str, str]        # attribute -> raw value text
    line: int
    is_root: bool = False

    def attr(self, key: str, default: str | None = None) -> str | None:
        return self.attrs.get(key, default)


@dataclass
class HloComputation:
    name: str
    instructions: list[HloInstruction]   # topological order
    by_name: dict[str, HloInstruction]
    root: HloInstruction
    line: int
    is_entry: bool = False

    def parameters(self) -> dict[int, HloInstruction]:
        out = {}
        for ins in self.instructions:
            if ins.opcode == "parameter":
                out[int(ins.raw_operands.strip())] = ins
        return out


@dataclass
class FrameTables:
    """The FileNames / FunctionNames / FileLocations / StackFrames tables."""

    file_names: dict[int, str] = field(default_factory=dict)
    function_names: dict[int, str] = field(default_factory=dict)
    file_locations: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    stack_frames: dict[int, tuple[int, int]] = field(default_factory=dict)


@dataclass
class HloModule:
    name: str
    file: str
    attrs: dict[str, str]
    computations: dict[str, HloComputation]
    entry: HloComputation
    frames: FrameTables = field(default_factory=FrameTables)

    def _int_attr(self, key: str) -> int | None:
        v = self.attrs.get(key)
        try:
            return int(v) if v is not None else None
        except ValueError:
            return None

    @property
    def num_partitions(self) -> int | None:
        return self._int_attr("num_partitions")

    @property
    def replica_count(self) -> int | None:
        return self._int_attr("replica_count")

    @property
    def partitioned(self) -> bool:
        """True for the output of XLA's SPMD partitioner (per-device shapes): it
        renames the entry computation to `*_spmd`."""
        return self.entry.name.endswith("_spmd")


# ---------------------------------------------------------------------------
# Text scanning

_OPEN = {"(": ")", "[": "]", "{": "}"}
_CLOSE = {")", "]", "}"}
_SPECIAL = re.compile(r'["(\[{)\]}]|/\*')


def _strip_comments_and_depth(line: str, depth: int, in_str: bool) -> tuple[str, int, bool]:
    """Remove /*...*/ comments outside strings; return the bracket depth and the
    in-string state after the line."""
    out = []
    i, n = 0, len(line)
    while i < n:
        if in_str:
            j = i
            while j < n:
                c = line[j]
                if c == "\\":
                    j += 2
                    continue
                if c == '"':
                    break
                j += 1
            if j >= n:
                out.append(line[i:])
                return "".join(out), depth, True
            out.append(line[i:j + 1])
            i = j + 1
            in_str = False
            continue
        m = _SPECIAL.search(line, i)
        if m is None:
            out.append(line[i:])
            break
        out.append(line[i:m.start()])
        tok = m.group()
        if tok == "/*":
            end = line.find("*/", m.end())
            i = n if end < 0 else end + 2
            continue
        out.append(tok)
        i = m.end()
        if tok == '"':
            in_str = True
        elif tok in _OPEN:
            depth += 1
        else:
            depth -= 1
    return "".join(out), depth, in_str


def _unescape(s: str) -> str:
    out = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            nxt = s[i + 1]
            out.append({"n": "\n", "t": "\t", "r": "\r"}.get(nxt, nxt))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


class _Cursor:
    """A position in one statement's text, for the recursive-descent parser."""

    def __init__(self, s: str, file: str, line: int) -> None:
        self.s, self.i, self.file, self.line = s, 0, file, line

    def error(self, msg: str) -> InputError:
        return InputError(msg, self.file, self.line)

    def ws(self) -> None:
        while self.i < len(self.s) and self.s[self.i].isspace():
            self.i += 1

    def at_end(self) -> bool:
        self.ws()
        return self.i >= len(self.s)

    def peek(self) -> str:
        self.ws()
        return self.s[self.i] if self.i < len(self.s) else ""

    def eat(self, tok: str) -> bool:
        self.ws()
        if self.s.startswith(tok, self.i):
            self.i += len(tok)
            return True
        return False

    def expect(self, tok: str, what: str) -> None:
        if not self.eat(tok):
            got = self.s[self.i:self.i + 30] or "end of line"
            raise self.error(f"expected {what} ('{tok}'), found {got!r}")

    def regex(self, pat: re.Pattern[str]) -> str | None:
        self.ws()
        m = pat.match(self.s, self.i)
        if m is None:
            return None
        self.i = m.end()
        return m.group()

    def balanced(self) -> str:
        """At an opening bracket: return the text up to its match (exclusive)
        and move past the match."""
        self.ws()
        start = self.i
        end = _scan(self.s, self.i, to_close=True)
        if end < 0:
            raise self.error("unbalanced brackets (truncated instruction?)")
        self.i = end + 1
        return self.s[start + 1:end]

    def until_comma(self) -> str:
        """Text up to the next comma at bracket depth 0 (or the end)."""
        self.ws()
        start = self.i
        self.i = _scan(self.s, self.i, to_close=False)
        return self.s[start:self.i].strip()


def _scan(s: str, i: int, to_close: bool, sep: str = ",") -> int:
    """From index i, skipping string literals: the index of the bracket closing
    the one at i (`to_close`; -1 if none), or of the next `sep` at bracket depth 0
    (or len(s))."""
    depth, in_str = 0, False
    while i < len(s):
        c = s[i]
        if in_str:
            if c == "\\":
                i += 2
                continue
            if c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth -= 1
            if to_close and depth == 0:
                return i
        elif c == sep and depth == 0 and not to_close:
            return i
        i += 1
    return -1 if to_close else i


def split_top(s: str, sep: str = ",") -> list[str]:
    """Split at `sep` outside brackets and strings."""
    parts, start = [], 0
    while start <= len(s):
        end = _scan(s, start, to_close=False, sep=sep)
        parts.append(s[start:end])
        start = end + 1
    return [p.strip() for p in parts if p.strip()]


_NAME = re.compile(r"%?[A-Za-z0-9_][\w.\-]*")
_DTYPE = re.compile(r"[a-z][a-z0-9]*(?=\[)")
_OPCODE = re.compile(r"[a-z][a-z0-9\-]*(?=\s*\()")
_ATTR_KEY = re.compile(r"[A-Za-z_][\w.\-]*")


def _parse_shape(c: _Cursor) -> HloShape:
    c.ws()
    if c.eat("("):
        elems = []
        if not c.eat(")"):
            while True:
                elems.append(_parse_shape(c))
                if c.eat(")"):
                    break
                c.expect(",", "',' or ')' in a tuple shape")
        return HloShape("tuple", elements=tuple(elems))
    start = c.i
    et = c.regex(_DTYPE)
    if et is None:
        raise c.error(f"bad shape {c.s[start:start + 30]!r}: expected an element type such as f32[...]")
    if et not in _DTYPES:
        raise c.error(f"bad shape: unknown element type {et!r}")
    dims_txt = c.balanced()
    dims = []
    for d in (x.strip() for x in dims_txt.split(",")) if dims_txt.strip() else ():
        if d.startswith("<=") or d == "?":
            raise c.error(f"dynamic dimension {d!r} in shape {et}[{dims_txt}] is not supported")
        if not re.fullmatch(r"\d+", d):
            raise c.error(f"bad shape {et}[{dims_txt}]: dimension {d!r} is not a non-negative integer")
        dims.append(int(d))
    layout = None
    if c.i < len(c.s) and c.s[c.i] == "{":
        lay = c.balanced()
        head = lay.split(":")[0].strip()
        if head:
            try:
                layout = tuple(int(x) for x in head.split(","))
            except ValueError:
                raise c.error(f"bad layout {{{lay}}} in shape {et}[{dims_txt}]") from None
            if sorted(layout) != list(range(len(dims))):
                raise c.error(f"bad layout {{{lay}}}: not a permutation of the {len(dims)} dims "
                              f"of {et}[{dims_txt}]")
        else:
            layout = ()
    return HloShape(_DTYPES[et], tuple(dims), layout)


def _parse_attrs(c: _Cursor) -> dict[str, str]:
    attrs: dict[str, str] = {}
    prev = None
    while not c.at_end():
        c.expect(",", "',' before an attribute")
        key = c.regex(_ATTR_KEY)
        if key is None:
            raise c.error(f"bad attribute at {c.s[c.i:c.i + 30]!r}")
        val = c.until_comma() if c.eat("=") else ""
        # `replica_groups=mesh[..], device_ids=(..) {axes}` prints a comma inside
        # one attribute value: glue the pieces back together.
        if key == "device_ids" and prev == "replica_groups":
            attrs["replica_groups"] += f", device_ids={val}"
            continue
        attrs[key] = val
        prev = key
    return attrs


def _operand_name(tok: str) -> str:
    # Old printers put the operand's shape first: `f32[2]{0} %x`.
    last = tok.split()[-1]
    return last[1:] if last.startswith("%") else last


def _parse_instruction(text: str, file: str, line: int) -> HloInstruction:
    c = _Cursor(text, file, line)
    is_root = False
    if c.s.lstrip().startswith("ROOT ") or c.s.lstrip().startswith("ROOT%"):
        c.eat("ROOT")
        is_root = True
    name = c.regex(_NAME)
    if name is None:
        raise c.error(f"expected an instruction 'name = shape opcode(...)', found {text[:40]!r}")
    name = name.lstrip("%")
    c.expect("=", "'=' after the instruction name")
    shape = _parse_shape(c)
    opcode = c.regex(_OPCODE)
    if opcode is None:
        raise c.error(f"instruction {name}: expected an opcode and '(' after the shape, found "
                      f"{c.s[c.i:c.i + 30]!r}")
    if opcode not in _KNOWN_OPCODES:
        raise UnknownOpError(f"unknown HLO opcode '{opcode}' (instruction {name})", file, line)
    c.ws()
    raw = c.balanced()
    attrs = _parse_attrs(c)
    if opcode in ("constant", "parameter", "iota"):
        operands: list[str] = []
    else:
        operands = [_operand_name(t) for t in split_top(raw)]
    if opcode == "parameter" and not re.fullmatch(r"\s*\d+\s*", raw):
        raise c.error(f"parameter {name}: expected parameter(N), found parameter({raw})")
    return HloInstruction(name, shape, opcode, operands, raw, attrs, line, is_root)


def _called(ins: HloInstruction) -> list[str]:
    out = []
    for key in _CALL_ATTRS:
        v = ins.attrs.get(key)
        if v is None:
            continue
        v = v.strip()
        if v.startswith("{"):
            v = v[1:-1]
        out += [x.strip().lstrip("%") for x in v.split(",") if x.strip()]
    return out


def _toposort(name: str, instrs: list[HloInstruction], file: str) -> list[HloInstruction]:
    by_name = {i.name: i for i in instrs}
    order: list[HloInstruction] = []
    state: dict[str, int] = {}  # 1 visiting, 2 done
    for root in instrs:
        if state.get(root.name) == 2:
            continue
        stack = [(root, 0)]
        state[root.name] = 1
        while stack:
            ins, k = stack.pop()
            if k < len(ins.operands):
                stack.append((ins, k + 1))
                op = ins.operands[k]
                dep = by_name.get(op)
                if dep is None:
                    raise InputError(f"instruction {ins.name}: operand %{op} is not defined in "
                                     f"computation {name}", file, ins.line)
                st = state.get(op)
                if st == 1:
                    raise InputError(f"instruction {ins.name}: cycle through operand %{op}",
                                     file, ins.line)
                if st is None:
                    state[op] = 1
                    stack.append((dep, 0))
            else:
                state[ins.name] = 2
                order.append(ins)
    return order


def _parse_table_line(kind: str, body: str, tables: FrameTables, file: str, line: int) -> None:
    m = re.match(r"(\d+)\s+(.*)$", body.strip())
    if m is None:
        raise InputError(f"bad {kind} entry {body.strip()!r}", file, line)
    idx, rest = int(m.group(1)), m.group(2).strip()
    if kind in ("FileNames", "FunctionNames"):
        if not (rest.startswith('"') and rest.endswith('"')):
            raise InputError(f"bad {kind} entry {body.strip()!r}", file, line)
        val = _unescape(rest[1:-1])
        (tables.file_names if kind == "FileNames" else tables.function_names)[idx] = val
        return
    kv = dict(re.findall(r"(\w+)=(-?\d+)", rest))
    try:
        if kind == "FileLocations":
            tables.file_locations[idx] = (int(kv["file_name_id"]), int(kv.get("function_name_id", 0)),
                                          int(kv.get("line", 0)))
        else:
            tables.stack_frames[idx] = (int(kv["file_location_id"]), int(kv.get("parent_frame_id", 0)))
    except KeyError as e:
        raise InputError(f"bad {kind} entry {body.strip()!r}: no {e.args[0]}", file, line) from None


_TABLES = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def _single_line(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Errors render as one line: fold newlines quoted from the input."""
    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except InputError as e:
            if "\n" in e.message or "\r" in e.message:
                e.message = re.sub(r"\s*[\r\n]+\s*", " ", e.message)
                e.args = (e.message,)
            raise
    return wrapper


@_single_line
def parse_hlo_module(text: str, file: str) -> HloModule:
    """Parse HLO text. Raises InputError(message, file, line) on malformed input."""
    lines = text.split("\n")
    n = len(lines)
    i = 0
    header: str | None = None
    header_line = 0
    tables = FrameTables()
    comps: dict[str, HloComputation] = {}
    entry_name: str | None = None
    table: str | None = None

    def logical(start: int) -> tuple[str, int]:
        """Join physical lines from `start` until brackets balance; return the
        text and the index of the next line."""
        parts, depth, in_str = [], 0, False
        j = start
        while j < n:
            clean, depth, in_str = _strip_comments_and_depth(lines[j], depth, in_str)
            parts.append(clean)
            j += 1
            if depth <= 0 and not in_str:
                return "\n".join(parts), j
        raise InputError("unexpected end of file inside this statement (unbalanced brackets or "
                         "quotes: truncated file?)", file, start + 1)

    while i < n:
        raw = lines[i]
        stripped = raw.strip()
        if not stripped or stripped.startswith("//"):
            table = None if not stripped else table
            i += 1
            continue
        if header is None:
            if not stripped.startswith("HloModule"):
                raise InputError("not an HLO text module: expected 'HloModule <name>' first",
                                 file, i + 1)
            header_line = i + 1
            header, i = logical(i)
            continue
        if stripped in _TABLES:
            table = stripped
            i += 1
            continue
        if table is not None and re.match(r"\d+\s", stripped):
            _parse_table_line(table, stripped, tables, file, i + 1)
            i += 1
            continue
        table = None
        # A computation: `[ENTRY] name [(params) -> shape] {`
        head, depth, in_str = _strip_comments_and_depth(raw, 0, False)
        if not head.rstrip().endswith("{") or depth != 1:
            raise InputError(f"unexpected text at top level: {stripped[:60]!r} (expected a "
                             f"computation 'name (...) -> shape {{')", file, i + 1)
        comp_line = i + 1
        hc = _Cursor(head, file, comp_line)
        is_entry = hc.eat("ENTRY ")
        cname = hc.regex(_NAME)
        if cname is None:
            raise InputError(f"bad computation header {stripped[:60]!r}", file, comp_line)
        cname = cname.lstrip("%")
        i += 1
        instrs: list[HloInstruction] = []
        closed = False
        while i < n:
            s = lines[i].strip()
            if not s or s.startswith("//"):
                i += 1
                continue
            if s == "}":
                closed = True
                i += 1
                break
            start = i
            stmt, i = logical(i)
            try:
                instrs.append(_parse_instruction(stmt.strip(), file, start + 1))
            except (ValueError, IndexError, KeyError) as e:
                raise InputError(f"malformed instruction ({type(e).__name__}: {e})", file,
                                 start + 1) from e
        if not closed:
            last = max(1, len(text.rstrip("\n").split("\n")))
            raise InputError(f"unexpected end of file: computation {cname} (line {comp_line}) is "
                             f"not closed with '}}' (truncated file?)", file, last)
        if not instrs:
            raise InputError(f"computation {cname} has no instructions", file, comp_line)
        seen: dict[str, HloInstruction] = {}
        for ins in instrs:
            if ins.name in seen:
                raise InputError(f"instruction name {ins.name} defined twice in computation {cname}",
                                 file, ins.line)
            seen[ins.name] = ins
        roots = [x for x in instrs if x.is_root]
        if len(roots) > 1:
            raise InputError(f"computation {cname} has several ROOT instructions", file, roots[1].line)
        root = roots[0] if roots else instrs[-1]
        order = _toposort(cname, instrs, file)
        if cname in comps:
            raise InputError(f"computation {cname} defined twice", file, comp_line)
        comps[cname] = HloComputation(cname, order, seen, root, comp_line, is_entry)
        if is_entry:
            if entry_name is not None:
                raise InputError("two ENTRY computations", file, comp_line)
            entry_name = cname
    if header is None:
        raise InputError("empty file: expected 'HloModule <name>'", file, 1)
    hcur = _Cursor(header.strip(), file, header_line)
    hcur.expect("HloModule", "'HloModule'")
    mname = hcur.regex(_NAME) or ""
    attrs = _parse_attrs(hcur)
    if not comps:
        raise InputError("the module has no computations (truncated file?)", file, len(lines))
    if entry_name is None:  # XLA's rule: the last computation is the entry
        entry_name = list(comps)[-1]
        comps[entry_name].is_entry = True
    for comp in comps.values():
        for ins in comp.instructions:
            for callee in _called(ins):
                if callee not in comps:
                    raise InputError(f"instruction {ins.name} calls computation %{callee}, which is "
                                     f"not defined", file, ins.line)
    entry = comps[entry_name]
    return HloModule(mname.lstrip("%"), file, attrs, comps, entry, tables)


# ---------------------------------------------------------------------------
# Attribute value parsers


def _ints(s: str | None) -> tuple[int, ...]:
    if s is None:
        return ()
    return tuple(int(x) for x in re.findall(r"-?\d+", s))


def _iota_devices(dims: list[int], reshape: list[int], perm: list[int] | None) -> np.ndarray:
    total = int(np.prod(reshape)) if reshape else 1
    arr = np.arange(total).reshape(reshape)
    if perm:
        arr = arr.transpose(perm)
    return arr.reshape(dims)


def parse_iota_list(s: str) -> np.ndarray | None:
    """`[2,4]<=[4,2]T(1,0)` -> arange(8).reshape(4,2).transpose(1,0).reshape(2,4)."""
    m = re.fullmatch(r"\s*\[([\d,\s]*)\]\s*<=\s*\[([\d,\s]*)\]\s*(?:T\(([\d,\s]*)\))?\s*", s)
    if m is None:
        return None
    dims = list(_ints(m.group(1)))
    reshape = list(_ints(m.group(2)))
    perm = list(_ints(m.group(3))) if m.group(3) is not None else None
    if int(np.prod(dims)) != int(np.prod(reshape)):
        raise ValueError(f"iota list {s.strip()}: {dims} and {reshape} hold different counts")
    return _iota_devices(dims, reshape, perm)


def _mesh_groups(s: str) -> list[list[int]]:
    """The mesh-axes form: `mesh['a'=4,'b'=2][, device_ids=(...)] {'a'}` (also
    `@mesh<a=4,b=2>`), with sub-axes `'a':(pre)size`. A group is the set of devices
    that agree on every mesh (sub-)axis not listed; members are ordered row-major
    over the listed axes in the given order, groups row-major over the rest."""
    m = re.match(r"\s*(?:mesh\[(.*?)\]|@mesh<(.*?)>)", s)
    if m is None:
        raise ValueError(f"cannot read replica groups {s!r}")
    axes_txt = m.group(1) if m.group(1) is not None else m.group(2)
    names, sizes = [], []
    for item in split_top(axes_txt):
        am = re.fullmatch(r"'?([^'=]+)'?\s*=\s*(\d+)", item.strip())
        if am is None:
            raise ValueError(f"bad mesh axis {item!r}")
        names.append(am.group(1).strip())
        sizes.append(int(am.group(2)))
    total = int(np.prod(sizes)) if sizes else 1
    rest = s[m.end():]
    devices = np.arange(total)
    dm = re.match(r"\s*,\s*device_ids=\((.*?)\)\s*(?=\{)", rest)
    if dm is not None:
        dtxt = dm.group(1).strip()
        im = re.fullmatch(r"\[([\d,\s]*)\]\s*(?:T\(([\d,\s]*)\))?", dtxt)
        if im is not None:
            reshape = list(_ints(im.group(1)))
            perm = list(_ints(im.group(2))) if im.group(2) is not None else None
            devices = _iota_devices([total], reshape, perm)
        else:
            devices = np.array(_ints(dtxt))
        if devices.size != total:
            raise ValueError(f"device_ids of {s!r} list {devices.size} devices for a mesh of {total}")
        rest = rest[dm.end():]
    am = re.match(r"\s*\{(.*)\}\s*$", rest)
    if am is None:
        raise ValueError(f"no axes list in replica groups {s!r}")
    refs = []  # (axis index, pre, size)
    for item in split_top(am.group(1)):
        rm = re.fullmatch(r"'?([^':]+)'?\s*(?::\s*\((\d+)\)\s*(\d+))?", item.strip())
        if rm is None or rm.group(1).strip() not in names:
            raise ValueError(f"bad mesh axis reference {item!r} in {s!r}")
        ax = names.index(rm.group(1).strip())
        if rm.group(2) is not None:
            pre, size = int(rm.group(2)), int(rm.group(3))
            if sizes[ax] % (pre * size):
                raise ValueError(f"sub-axis {item!r}: ({pre}){size} does not divide axis size "
                                 f"{sizes[ax]}")
        else:
            pre, size = 1, sizes[ax]
        refs.append((ax, pre, size))
    # Refine every axis into pieces at all the sub-axis boundaries.
    pieces: list[list[int]] = []  # per axis: boundary products (major to minor)
    for ax, n in enumerate(sizes):
        cuts = {1, n}
        for a, pre, size in refs:
            if a == ax:
                cuts |= {pre, pre * size}
        cuts_s = sorted(cuts)
        for a in range(len(cuts_s) - 1):
            if cuts_s[a + 1] % cuts_s[a]:
                raise ValueError(f"overlapping sub-axes of {names[ax]!r} in {s!r}")
        pieces.append(cuts_s)
    fine_shape, fine_index = [], {}  # (axis, cut_lo) -> fine dim
    for ax, cuts in enumerate(pieces):
        for lo, hi in zip(cuts, cuts[1:]):
            fine_index[(ax, lo)] = len(fine_shape)
            fine_shape.append(hi // lo)
    grid = devices.reshape(fine_shape if fine_shape else [1])
    group_dims: list[int] = []
    for ax, pre, size in refs:
        cuts = pieces[ax]
        lo = pre
        while lo < pre * size:
            d = fine_index[(ax, lo)]
            if d in group_dims:
                raise ValueError(f"axis {names[ax]!r} listed twice in {s!r}")
            group_dims.append(d)
            lo = lo * fine_shape[d]
    other = [d for d in range(len(fine_shape)) if d not in group_dims]
    arr = grid.transpose(other + group_dims)
    gsize = int(np.prod([fine_shape[d] for d in group_dims])) if group_dims else 1
    return arr.reshape(-1, gsize).tolist()


def parse_replica_groups(s: str | None) -> list[list[int]] | None:
    """All three printed forms; None for `{}` (one group of every rank)."""
    if s is None:
        return None
    t = s.strip()
    if t.startswith("{"):
        inner = t[1:-1].strip()
        if not inner:
            return None
        groups = []
        for g in split_top(inner):
            g = g.strip()
            if not (g.startswith("{") and g.endswith("}")):
                raise ValueError(f"bad replica group {g!r}")
            groups.append(list(_ints(g)))
        return groups
    if t.startswith("["):
        arr = parse_iota_list(t)
        if arr is None:
            raise ValueError(f"bad iota replica groups {t!r}")
        return arr.reshape(arr.shape[0], -1).tolist()
    if t.startswith("mesh[") or t.startswith("@mesh<"):
        return _mesh_groups(t)
    raise ValueError(f"unknown replica group format {t!r}")


@dataclass(frozen=True)
class HloSharding:
    """A parsed `sharding={...}`. kind: replicated | maximal | tiled | manual |
    unknown | tuple. For tiled: `tile_dims` per data dim and `devices`, the tile
    assignment of shape tile_dims + replication dims."""

    kind: str
    text: str
    tile_dims: tuple[int, ...] = ()
    devices: np.ndarray | None = None
    device: int | None = None
    manual_subgroup: bool = False
    elements: tuple["HloSharding", ...] = ()

    def relation(self, shape: tuple[int, ...], local: bool, ranks: int | None = None
                 ) -> BlockRelation | None:
        """The block each device holds: `shape` is the per-device shape if `local`
        (a partitioned module), else the global shape. None when the sharding is
        not a set of even blocks over devices 0..N-1."""
        shape = tuple(shape)
        if self.kind == "replicated":
            if ranks is None:
                return None
            return BlockRelation(shape, shape, tuple((0,) * len(shape) for _ in range(ranks)))
        if self.kind != "tiled" or self.devices is None or self.manual_subgroup:
            return None
        if len(self.tile_dims) != len(shape):
            return None
        if local:
            loc = shape
            glob = tuple(s * t for s, t in zip(shape, self.tile_dims))
        else:
            glob = shape
            if any(s % t for s, t in zip(shape, self.tile_dims)):
                return None
            loc = tuple(s // t for s, t in zip(shape, self.tile_dims))
        n = int(self.devices.size)
        if ranks is not None and ranks != n:
            return None
        if sorted(self.devices.reshape(-1).tolist()) != list(range(n)):
            return None
        offsets: list[tuple[int, ...] | None] = [None] * n
        for idx in np.ndindex(*self.devices.shape):
            d = int(self.devices[idx])
            offsets[d] = tuple(int(i) * l for i, l in zip(idx[:len(loc)], loc))
        return BlockRelation(glob, loc, tuple(offsets))  # type: ignore[arg-type]


def parse_sharding(s: str) -> HloSharding:
    t = s.strip()
    if t.startswith("{") and t.endswith("}"):
        t = t[1:-1].strip()
    if t.startswith("{"):
        return HloSharding("tuple", s, elements=tuple(parse_sharding(e) for e in split_top(t)))
    t = re.sub(r"\s*metadata=\{.*\}\s*$", "", t)
    if t == "replicated" or t.startswith("replicated "):
        return HloSharding("replicated", s)
    if t.startswith("maximal"):
        m = re.search(r"device=(\d+)", t)
        return HloSharding("maximal", s, device=int(m.group(1)) if m else None)
    if t.startswith("manual"):
        return HloSharding("manual", s)
    if t.startswith("unknown"):
        return HloSharding("unknown", s)
    m = re.match(r"devices=\[([\d,\s]*)\]\s*(.*)$", t)
    if m is None:
        raise ValueError(f"cannot read sharding {s!r}")
    dims = list(_ints(m.group(1)))
    rest = m.group(2).strip()
    im = re.match(r"(<=\s*\[[\d,\s]*\]\s*(?:T\([\d,\s]*\))?)(.*)$", rest)
    if im is not None:
        arr = parse_iota_list(f"[{','.join(map(str, dims))}]{im.group(1)}")
        assert arr is not None
        rest = im.group(2).strip()
    else:
        lm = re.match(r"([\d,\s]+)(.*)$", rest)
        if lm is None:
            raise ValueError(f"cannot read the devices of sharding {s!r}")
        ids = [int(x) for x in lm.group(1).replace(" ", "").split(",") if x]
        if len(ids) != int(np.prod(dims)):
            raise ValueError(f"sharding {s!r} lists {len(ids)} devices for tiles {dims}")
        arr = np.array(ids).reshape(dims)
        rest = lm.group(2).strip()
    n_data = len(dims)
    manual = False
    if "last_tile_dim_replicate" in rest:
        n_data -= 1
    lm = re.search(r"last_tile_dims=\{([^}]*)\}", rest)
    if lm is not None:
        kinds = [k.strip() for k in lm.group(1).split(",") if k.strip()]
        n_data -= len(kinds)
        manual = any(k == "manual" for k in kinds)
    return HloSharding("tiled", s, tuple(dims[:n_data]), arr, manual_subgroup=manual)


def _parse_literal(raw: str, shape: HloShape, ins: HloInstruction, file: str) -> np.ndarray | None:
    t = raw.strip()
    if "..." in t:
        return None  # elided: unknown value, never zeros
    t = re.sub(r"^[a-z][a-z0-9]*\[[^\]]*\](\{[^}]*\})?\s*", "", t)  # old printers: shape first
    dt = _np_dtype(shape.dtype)
    toks = re.findall(r"[^\s{},()]+", t)
    vals: list[Any] = []
    for tok in toks:
        low = tok.lower()
        if low in ("true", "false"):
            vals.append(low == "true")
        elif low in ("inf", "+inf", "-inf", "nan", "-nan", "+nan"):
            vals.append(float(low.replace("+", "")))
        else:
            try:
                is_int = re.fullmatch(r"[-+]?(0x[0-9a-fA-F]+|\d+)", tok)
                vals.append(int(tok, 0) if is_int else float(tok))
            except ValueError:
                raise InputError(f"constant {ins.name}: cannot read literal value {tok!r}", file,
                                 ins.line) from None
    count = int(np.prod(shape.dims)) if shape.dims else 1
    if shape.dtype.startswith("complex"):
        if len(vals) != 2 * count:
            raise InputError(f"constant {ins.name}: {len(vals)} numbers for {count} complex values",
                             file, ins.line)
        arr = np.array([complex(a, b) for a, b in zip(vals[::2], vals[1::2])], dtype=dt)
    else:
        if len(vals) != count:
            raise InputError(f"constant {ins.name}: literal has {len(vals)} values but the shape "
                             f"{shape} holds {count}", file, ins.line)
        arr = np.array(vals, dtype=dt)
    return arr.reshape(shape.dims)


# ---------------------------------------------------------------------------
# Lowering to IR

_UNARY = {
    "abs": "abs", "ceil": "ceil", "floor": "floor", "cosine": "cos", "sine": "sin", "tan": "tan",
    "exponential": "exp", "exponential-minus-one": "expm1", "log": "log",
    "log-plus-one": "log1p", "logistic": "logistic", "negate": "neg", "not": "not",
    "sign": "sign", "sqrt": "sqrt", "rsqrt": "rsqrt", "cbrt": "cbrt", "tanh": "tanh",
    "is-finite": "is_finite", "popcnt": "population_count", "count-leading-zeros": "clz",
    "clz": "clz", "real": "real", "imag": "imag", "erf": "erf",
}
_BINARY = {
    "add": "add", "subtract": "sub", "multiply": "mul", "divide": "div", "maximum": "max",
    "minimum": "min", "power": "pow", "remainder": "rem", "atan2": "atan2", "and": "and",
    "or": "or", "xor": "xor", "shift-left": "shift_left",
    "shift-right-logical": "shift_right_logical",
    "shift-right-arithmetic": "shift_right_arithmetic", "complex": "complex",
}
_COMPARE = {"EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge"}
# str(jax.lax.RoundingMethod.X), as frontends/jaxpr.py records it.
_ROUNDING = {"round-nearest-afz": "0", "round-nearest-even": "1"}
_ALIASES = ("copy", "reduce-precision", "domain", "opt-barrier", "optimization-barrier",
            "copy-done")

# Values small enough to track for static evaluation (loop counters, inits).
_KNOWN_LIMIT = 4096
_MAX_UNROLL = 4096

_LIBRARY_PATH = re.compile(r"site-packages|dist-packages|/torch_neuronx/|/_pytest/|/pluggy/|"
                           r"/lib/python3\.\d+/(?!site-packages)")


@dataclass
class _Async:
    """The value of an async `*-start`: its `*-done` yields `value`."""

    value: Any


Val = Any  # int (tensor id) | tuple[Val, ...] | _Async | None (token)


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


class _Lowerer:
    def __init__(self, module: HloModule, b: GraphBuilder, ranks: int | None,
                 registry: dict[str, Any] | None, instruction_frames: bool = False) -> None:
        self.m = module
        self.instruction_frames = instruction_frames
        self.b = b
        self.file = module.file
        self.R = module.replica_count or 1
        self.P = module.num_partitions or 1
        self.ranks = ranks if ranks is not None else self.R * self.P
        if registry is None:
            from dlverify.frontends.custom_calls import builtin_registry
            registry = builtin_registry()
        self.registry = registry
        self.known: dict[int, np.ndarray] = {}
        self.assumptions: list[str] = []
        self.custom_calls: dict[str, int] = {}
        self._frame_cache: dict[int, tuple[Frame, ...]] = {}
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

    def loc(self, ins: HloInstruction, outer: SourceLoc | None) -> SourceLoc:
        """Where `ins` comes from: the user frames of its metadata (else those of the
        instruction calling its computation); with `instruction_frames`, the
        instruction's own line in the HLO file comes first."""
        loc = self._user_loc(ins, outer)
        if not self.instruction_frames:
            return loc
        here = Frame(self.file, ins.line, ins.name)
        return SourceLoc((here,) + tuple(f for f in loc.frames if f != here), loc.op_name)

    def _user_loc(self, ins: HloInstruction, outer: SourceLoc | None) -> SourceLoc:
        md = ins.attrs.get("metadata")
        frames: tuple[Frame, ...] = ()
        op_name = ""
        if md:
            kv = {k: v for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s}]+)', md)}
            val = {k: _unescape(v[1:-1]) if v.startswith('"') else v for k, v in kv.items()}
            op_name = val.get("op_name", "")
            if "stack_frame_id" in val:
                try:
                    frames = self._stack(int(val["stack_frame_id"]))
                except ValueError:
                    frames = ()
            if not frames and val.get("source_file"):
                frames = _source_file_frames(val["source_file"], val.get("source_line", "0"))
        if frames or op_name:
            if not frames and outer is not None and outer.frames:
                frames = outer.frames
            return SourceLoc(frames, op_name)
        if outer is not None and (outer.frames or outer.op_name):
            return outer
        return SourceLoc((Frame(self.file, ins.line, ins.name),), "")

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
        if int(np.prod(shape)) > _KNOWN_LIMIT:
            return
        xs = [self.known[i] for i in inputs]
        try:
            v = _eval_small(kind, xs, shape, params)
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
        loc = self.loc(ins, outer)
        fn = _HANDLERS.get(op)
        if fn is not None:
            try:
                return fn(self, ins, ops, comp, loc)
            except (KeyError, ValueError, IndexError, TypeError) as e:
                # A malformed instruction the handler did not anticipate: still
                # one line naming the instruction, never a traceback.
                raise self.err(ins, f"malformed {op} instruction ({type(e).__name__}: {e})") from e
        if op in _UNARY:
            return self.elementwise(ins, _UNARY[op], ops, loc)
        if op in _BINARY:
            return self.elementwise(ins, _BINARY[op], ops, loc)
        if op in _ALIASES:
            if op == "copy-done":
                return ops[0].value if isinstance(ops[0], _Async) else ops[0]
            if len(ops) != 1:
                return tuple(ops)
            return ops[0]
        raise self.unknown(ins, f"no translation for HLO opcode '{op}' (frontends/hlo_text.py)")

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

    def reducer(self, ins: HloInstruction, allowed: dict[str, str]) -> str:
        """The reduction a `to_apply` computation performs, by its root opcode."""
        cname = (ins.attrs.get("to_apply") or "").lstrip("%")
        comp = self.m.computations.get(cname)
        if comp is None:
            raise self.err(ins, "no to_apply reducer computation")
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
        while ins.opcode == "convert" and not ins.shape.is_tuple and _is_float(ins.shape.dtype):
            src = comp.by_name[ins.operands[0]]
            if src.shape.is_tuple or not _is_float(src.shape.dtype):
                break
            ins = src
        return ins.name

    root = comp.by_name[strip(comp.root.name)]
    if len(root.operands) != 2:
        return None
    if {strip(o) for o in root.operands} != pnames:
        return None
    return root.opcode


def _eval_small(kind: str, xs: list[np.ndarray], shape: tuple[int, ...], p: dict) -> Any:
    ew = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum,
          "min": np.minimum, "and": np.logical_and, "or": np.logical_or, "eq": np.equal,
          "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
          "ge": np.greater_equal}
    if kind in ew:
        a, b = xs
        if a.dtype == np.bool_ and kind in ("and", "or"):
            return ew[kind](a, b)
        if kind == "and":
            return np.bitwise_and(a, b)
        if kind == "or":
            return np.bitwise_or(a, b)
        return ew[kind](a, b)
    if kind == "div":
        a, b = xs
        if np.issubdtype(a.dtype, np.integer):
            return np.trunc(a / b).astype(a.dtype)
        return a / b
    if kind == "neg":
        return -xs[0]
    if kind == "not":
        return np.logical_not(xs[0]) if xs[0].dtype == np.bool_ else np.invert(xs[0])
    if kind == "select_n":
        return np.choose(xs[0].astype(np.int64), xs[1:])
    if kind == "broadcast_in_dim":
        x = xs[0]
        sh = [1] * len(shape)
        for i, d in enumerate(p["broadcast_dimensions"]):
            sh[d] = x.shape[i]
        return np.broadcast_to(x.reshape(sh), shape)
    if kind == "reshape":
        return xs[0].reshape(shape)
    if kind == "convert_to_int":
        return np.trunc(xs[0]).astype(np.int64)
    if kind == "convert_to_bool":
        return xs[0] != 0
    if kind == "iota":
        idx = np.arange(shape[p["dimension"]])
        sh = [1] * len(shape)
        sh[p["dimension"]] = -1
        return np.broadcast_to(idx.reshape(sh), shape)
    if kind == "slice":
        st = p.get("strides") or (1,) * len(shape)
        return xs[0][tuple(slice(a, b, s) for a, b, s in
                           zip(p["start_indices"], p["limit_indices"], st))]
    if kind == "concatenate":
        return np.concatenate(xs, axis=p["dimension"])
    if kind == "transpose":
        return np.transpose(xs[0], p["permutation"])
    return None


# ---------------------------------------------------------------------------
# Opcode handlers

Handler = Callable[[_Lowerer, HloInstruction, list[Val], HloComputation, SourceLoc], Val]
_HANDLERS: dict[str, Handler] = {}


def handler(*names: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for n in names:
            _HANDLERS[n] = fn
        return fn
    return deco


@handler("compare")
def _compare(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    d = (ins.attrs.get("direction") or "").strip()
    if d not in _COMPARE:
        raise L.err(ins, f"compare without a known direction (got {d!r})")
    return L.elementwise(ins, _COMPARE[d], ops, loc)


@handler("select")
def _select(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    if len(ops) != 3:
        raise L.err(ins, "select takes (pred, on_true, on_false)")
    if isinstance(ops[1], tuple):  # old tuple select: statically chosen only
        raise L.unknown(ins, "select of tuples is not supported")
    pred, on_true, on_false = ops
    return L.elementwise(ins, "select_n", [pred, on_false, on_true], loc)


@handler("clamp")
def _clamp(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    return L.elementwise(ins, "clamp", ops, loc)  # clamp(min, x, max), as lax.clamp


@handler("round-nearest-afz", "round-nearest-even")
def _round(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    return L.elementwise(ins, "round", ops, loc, {"rounding": _ROUNDING[ins.opcode]})


@handler("convert")
def _convert(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    t = L.tid(ins, ops[0])
    src = L.dtype_of(t)
    dst = L.array_shape(ins).dtype
    if _is_float(dst) or not _is_float(src):
        # float<->float and int/bool->float are identities over the reals.
        if L.shape_of(t) != ins.shape.dims:
            raise L.err(ins, f"convert changes the shape {L.shape_of(t)} -> {ins.shape.dims}")
        return t
    kind = "convert_to_bool" if dst == "bool" else "convert_to_int"
    return L.elementwise(ins, kind, [t], loc)


@handler("bitcast-convert")
def _bitcast_convert(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                     loc: SourceLoc) -> Val:
    t = L.tid(ins, ops[0])
    if L.dtype_of(t) == ins.shape.dtype and L.shape_of(t) == ins.shape.dims:
        return t
    raise L.unknown(ins, "bitcast-convert reinterprets bits: no translation")


@handler("broadcast")
def _broadcast(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
               loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    dims = _ints(ins.attrs.get("dimensions"))
    if len(dims) != len(L.shape_of(t)):
        raise L.err(ins, f"broadcast dimensions {dims} do not match the operand rank "
                         f"{len(L.shape_of(t))}")
    return L.emit("broadcast_in_dim", [t], sh.dims, sh.dtype,
                  {"broadcast_dimensions": tuple(dims)}, loc, ins.name)


def _reshape_to(L: _Lowerer, ins: HloInstruction, t: int, dims: tuple[int, ...], loc: SourceLoc,
                dtype: str | None = None) -> int:
    if int(np.prod(L.shape_of(t))) != int(np.prod(dims)):
        raise L.err(ins, f"reshape {L.shape_of(t)} -> {dims} changes the element count")
    if L.shape_of(t) == tuple(dims):
        return t
    return L.emit("reshape", [t], tuple(dims), dtype or L.dtype_of(t), {}, loc, ins.name)


@handler("reshape")
def _reshape(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    if int(np.prod(L.shape_of(t))) != int(np.prod(sh.dims)):
        raise L.err(ins, f"reshape {L.shape_of(t)} -> {sh.dims} changes the element count")
    if L.shape_of(t) == sh.dims and L.dtype_of(t) == sh.dtype:
        return t  # a reshape to the same shape (a layout change in XLA) is the identity
    return L.emit("reshape", [t], sh.dims, sh.dtype, {}, loc, ins.name)


def _trivial_perm(shape: tuple[int, ...], perm: tuple[int, ...]) -> bool:
    """A transpose that only moves size-1 dims is a reshape."""
    big = [p for p in perm if shape[p] != 1]
    return big == sorted(big)


def _transpose_or_reshape(L: _Lowerer, ins: HloInstruction, t: int, perm: tuple[int, ...],
                          loc: SourceLoc) -> int:
    shape = L.shape_of(t)
    if perm == tuple(range(len(perm))):
        return t
    out = tuple(shape[p] for p in perm)
    if _trivial_perm(shape, perm):
        return _reshape_to(L, ins, t, out, loc)
    return L.emit("transpose", [t], out, L.dtype_of(t), {"permutation": perm}, loc, ins.name)


@handler("bitcast")
def _bitcast(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    """A bitcast reinterprets the operand's physical buffer in the result's
    layout: transpose to the operand's physical (major-to-minor) order, reshape,
    transpose back from the result's physical order."""
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    src = comp.by_name[ins.operands[0]].shape
    if src.is_tuple:
        raise L.err(ins, "bitcast of a tuple")
    if src.dtype != sh.dtype:
        raise L.unknown(ins, f"bitcast changes the element type {src.dtype} -> {sh.dtype}")
    if int(np.prod(src.dims)) != int(np.prod(sh.dims)):
        raise L.err(ins, f"bitcast {src} -> {sh} changes the element count")
    phys_in = tuple(reversed(src.minor_to_major))
    phys_out = tuple(reversed(sh.minor_to_major))
    x = _transpose_or_reshape(L, ins, t, phys_in, loc)
    x = _reshape_to(L, ins, x, tuple(sh.dims[d] for d in phys_out), loc)
    inv = tuple(int(i) for i in np.argsort(phys_out))
    x = _transpose_or_reshape(L, ins, x, inv, loc)
    return x


@handler("transpose")
def _transpose(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
               loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    perm = _ints(ins.attrs.get("dimensions"))
    if sorted(perm) != list(range(len(L.shape_of(t)))):
        raise L.err(ins, f"transpose dimensions {perm} are not a permutation")
    return L.emit("transpose", [t], sh.dims, sh.dtype, {"permutation": tuple(perm)}, loc, ins.name)


@handler("slice")
def _slice(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    spec = ins.attrs.get("slice") or ""
    ranges = re.findall(r"\[\s*(-?\d+)\s*:\s*(-?\d+)\s*(?::\s*(-?\d+))?\s*\]", spec)
    if len(ranges) != len(L.shape_of(t)):
        raise L.err(ins, f"slice={spec} does not give one range per operand dim")
    starts = tuple(int(a) for a, _, _ in ranges)
    limits = tuple(int(b) for _, b, _ in ranges)
    strides = tuple(int(s) if s else 1 for _, _, s in ranges)
    return L.emit("slice", [t], sh.dims, sh.dtype, {
        "start_indices": starts, "limit_indices": limits,
        "strides": None if all(s == 1 for s in strides) else strides}, loc, ins.name)


def _scalar_starts(L: _Lowerer, ins: HloInstruction, idx: list[Val], rank: int,
                   loc: SourceLoc) -> list[int]:
    ts = [L.tid(ins, v) for v in idx]
    if len(ts) == rank and all(L.shape_of(x) == () for x in ts):
        return ts
    if len(ts) == 1 and L.shape_of(ts[0]) == (rank,):  # old form: one index vector
        out = []
        for d in range(rank):
            s = L.emit("slice", [ts[0]], (1,), L.dtype_of(ts[0]),
                       {"start_indices": (d,), "limit_indices": (d + 1,), "strides": None},
                       loc, ins.name)
            out.append(L.emit("reshape", [s], (), L.dtype_of(ts[0]), {}, loc, ins.name))
        return out
    raise L.err(ins, f"expected {rank} scalar start indices")


@handler("dynamic-slice")
def _dynamic_slice(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                   loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t = L.tid(ins, ops[0])
    starts = _scalar_starts(L, ins, ops[1:], len(L.shape_of(t)), loc)
    sizes = _ints(ins.attrs.get("dynamic_slice_sizes")) or sh.dims
    return L.emit("dynamic_slice", [t] + starts, sh.dims, sh.dtype,
                  {"slice_sizes": tuple(sizes)}, loc, ins.name)


@handler("dynamic-update-slice")
def _dus(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
         loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    t, u = L.tid(ins, ops[0]), L.tid(ins, ops[1])
    starts = _scalar_starts(L, ins, ops[2:], len(L.shape_of(t)), loc)
    return L.emit("dynamic_update_slice", [t, u] + starts, sh.dims, sh.dtype, {}, loc, ins.name)


@handler("concatenate")
def _concat(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    dims = _ints(ins.attrs.get("dimensions"))
    if len(dims) != 1:
        raise L.err(ins, "concatenate needs dimensions={d}")
    return L.elementwise(ins, "concatenate", ops, loc, {"dimension": dims[0]})


@handler("iota")
def _iota(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
          loc: SourceLoc) -> Val:
    sh = L.array_shape(ins)
    d = _ints(ins.attrs.get("iota_dimension"))
    if len(d) != 1 or not 0 <= d[0] < len(sh.dims):
        raise L.err(ins, "iota needs iota_dimension=d within the shape")
    return L.emit("iota", [], sh.dims, sh.dtype, {"dimension": d[0]}, loc, ins.name)


@handler("pad")
def _pad(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
         loc: SourceLoc) -> Val:
    cfg = []
    for part in (ins.attrs.get("padding") or "").split("x"):
        nums = [int(x) for x in part.split("_")] if part else []
        if len(nums) == 2:
            nums.append(0)
        if len(nums) != 3:
            raise L.err(ins, f"bad padding={ins.attrs.get('padding')}")
        cfg.append(tuple(nums))
    return L.elementwise(ins, "pad", ops, loc, {"padding_config": tuple(cfg)})


@handler("reverse")
def _reverse(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    return L.elementwise(ins, "rev", ops, loc, {"dimensions": _ints(ins.attrs.get("dimensions"))})


@handler("dot")
def _dot(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
         loc: SourceLoc) -> Val:
    if "sparsity" in ins.attrs or len(ops) != 2:
        raise L.unknown(ins, "sparse dot is not supported")
    return L.elementwise(ins, "dot_general", ops, loc, {
        "lhs_contract": _ints(ins.attrs.get("lhs_contracting_dims")),
        "rhs_contract": _ints(ins.attrs.get("rhs_contracting_dims")),
        "lhs_batch": _ints(ins.attrs.get("lhs_batch_dims")),
        "rhs_batch": _ints(ins.attrs.get("rhs_batch_dims"))})


def _identity_value(op: str, dtype: str) -> list[Any]:
    """Acceptable init values of a reduce with reducer `op`."""
    dt = _np_dtype(dtype)
    if op == "add":
        return [0]
    if op == "multiply":
        return [1]
    if op in ("or", "xor"):
        return [0, False]
    if op == "and":
        return [True] if dt == np.bool_ else [True, -1] + ([np.iinfo(dt).max] if dt.kind == "u" else [])
    if op in ("maximum", "minimum"):
        inf = float("inf") if op == "minimum" else float("-inf")
        if dt == np.bool_:
            return [op == "minimum"]
        if dt.kind in "iu":
            info = np.iinfo(dt)
            return [info.max if op == "minimum" else info.min]
        vals: list[Any] = [inf]
        try:
            import ml_dtypes
            fi = ml_dtypes.finfo(dt)
        except (ImportError, ValueError, TypeError):
            fi = np.finfo(dt)
        vals.append(float(fi.max) if op == "minimum" else float(fi.min))
        return vals
    return []


_REDUCE_KINDS = {"add": "reduce_sum", "maximum": "reduce_max", "minimum": "reduce_min",
                 "multiply": "reduce_prod", "and": "reduce_and", "or": "reduce_or",
                 "xor": "reduce_xor"}


@handler("reduce")
def _reduce(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    if ins.shape.is_tuple or len(ops) != 2:
        raise L.unknown(ins, "variadic (tuple) reduce is not supported")
    op = L.reducer(ins, {k: k for k in _REDUCE_KINDS})
    x, init = L.tid(ins, ops[0]), L.tid(ins, ops[1])
    if L.shape_of(init) != ():
        raise L.err(ins, "reduce init value must be a scalar")
    val = L.known.get(init)
    ok = _identity_value(op, L.dtype_of(init))
    if val is None:
        raise L.unknown(ins, f"reduce ({op}) with an init value that is not a known constant")
    v = val.reshape(()).item()
    if not any(v == o for o in ok):
        raise L.unknown(ins, f"reduce ({op}) with init value {v}, which is not the identity of "
                             f"{op}")
    sh = L.array_shape(ins)
    axes = _ints(ins.attrs.get("dimensions"))
    return L.emit(_REDUCE_KINDS[op], [x], sh.dims, sh.dtype, {"axes": tuple(axes)}, loc, ins.name)


@handler("constant")
def _constant(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
              loc: SourceLoc) -> Val:
    if ins.shape.is_tuple:
        raise L.unknown(ins, "tuple-shaped constants are not supported")
    val = _parse_literal(ins.raw_operands, ins.shape, ins, L.file)
    out = L.b.constant(val, ins.shape.dims, ins.shape.dtype, loc, ins.name)
    if val is not None and val.size <= _KNOWN_LIMIT:
        L.known[out] = val
    return out


@handler("gather")
def _gather(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    ivd = _ints(ins.attrs.get("index_vector_dim"))
    return L.elementwise(ins, "gather", ops, loc, {
        "offset_dims": _ints(ins.attrs.get("offset_dims")),
        "collapsed_slice_dims": _ints(ins.attrs.get("collapsed_slice_dims")),
        "start_index_map": _ints(ins.attrs.get("start_index_map")),
        "operand_batching_dims": _ints(ins.attrs.get("operand_batching_dims")),
        "start_indices_batching_dims": _ints(ins.attrs.get("start_indices_batching_dims")),
        "index_vector_dim": ivd[0] if ivd else None,
        "slice_sizes": _ints(ins.attrs.get("slice_sizes")),
        "indices_are_sorted": ins.attrs.get("indices_are_sorted", "false") == "true"})


@handler("tuple")
def _tuple(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    return tuple(ops)


@handler("get-tuple-element")
def _gte(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
         loc: SourceLoc) -> Val:
    v = ops[0]
    idx = _ints(ins.attrs.get("index"))
    if not isinstance(v, tuple) or len(idx) != 1 or not 0 <= idx[0] < len(v):
        raise L.err(ins, "get-tuple-element of a non-tuple or out of range")
    return v[idx[0]]


@handler("add-dependency")
def _add_dep(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    return ops[0]


@handler("after-all")
def _after_all(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
               loc: SourceLoc) -> Val:
    return None


@handler("get-dimension-size")
def _get_dim(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    t = L.tid(ins, ops[0])
    d = _ints(ins.attrs.get("dimensions"))
    val = np.array(L.shape_of(t)[d[0]], dtype=_np_dtype(ins.shape.dtype))
    out = L.b.constant(val, (), ins.shape.dtype, loc, ins.name)
    L.known[out] = val
    return out


@handler("partition-id", "replica-id")
def _axis_index(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    if L.R > 1 and L.P > 1:
        raise L.unknown(ins, f"{ins.opcode} with both replicas ({L.R}) and partitions ({L.P}) is "
                             f"not expressible over one flat axis")
    sh = L.array_shape(ins)
    return L.emit("axis_index", [], sh.dims, sh.dtype, {"axis": FLAT_AXIS}, loc, ins.name)


@handler("call")
def _call(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
          loc: SourceLoc) -> Val:
    callee = L.m.computations[(ins.attrs.get("to_apply") or "").lstrip("%")]
    return L.run_comp(callee, ops, loc, ins)


@handler("fusion")
def _fusion(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
            loc: SourceLoc) -> Val:
    callee = L.m.computations[(ins.attrs.get("calls") or "").lstrip("%")]
    return L.run_comp(callee, ops, loc, ins)


@handler("async-start")
def _async_start(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                 loc: SourceLoc) -> Val:
    name = (ins.attrs.get("calls") or "").lstrip("%")
    if name not in L.m.computations:
        raise L.unknown(ins, "async-start without calls=")
    return _Async(L.run_comp(L.m.computations[name], ops, loc, ins))


@handler("async-update")
def _async_update(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                  loc: SourceLoc) -> Val:
    return ops[0]


@handler("async-done", "all-reduce-done", "all-gather-done", "collective-permute-done")
def _async_done(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    if not isinstance(ops[0], _Async):
        raise L.err(ins, f"{ins.opcode} of an operand that is not a matching *-start")
    return ops[0].value


@handler("copy-start")
def _copy_start(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    return _Async(ops[0])


@handler("custom-call")
def _custom_call(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                 loc: SourceLoc) -> Val:
    from dlverify.frontends.custom_calls import expand
    target = (ins.attrs.get("custom_call_target") or "").strip().strip('"')
    spec = L.registry.get(target)
    if spec is None:
        raise L.unknown(ins, f"custom call target '{target}' is not in the custom-call registry "
                             f"(dlverify/custom_calls.toml; add it there or in a --custom-calls file)")
    out, assumption = expand(spec, L, ins, ops, loc)
    L.custom_calls[target] = L.custom_calls.get(target, 0) + 1
    L.assume(assumption)
    return out


def _shape_for(ins: HloInstruction, shape: HloShape, i: int, n: int) -> HloShape:
    if n == 1 and not shape.is_tuple:
        return shape
    if not shape.is_tuple or len(shape.elements) != n:
        raise InputError(f"{ins.name}: {n} operands but result shape {shape}", "", ins.line)
    return shape.elements[i]


def _collective(L: _Lowerer, ins: HloInstruction, ops: list[Val], loc: SourceLoc, kind: str,
                params: dict, result: HloShape) -> Val:
    ts = [L.tid(ins, v) for v in ops]
    outs = []
    for i, t in enumerate(ts):
        try:
            sh = _shape_for(ins, result, i, len(ts))
        except InputError as e:
            raise L.err(ins, e.message.split(": ", 1)[1]) from None
        outs.append(L.emit(kind, [t], sh.dims, sh.dtype, dict(params), loc, ins.name))
    if len(outs) == 1 and not result.is_tuple:
        return outs[0]
    return tuple(outs)


_AR_REDUCERS = {"add": "sum", "maximum": "max", "minimum": "min"}


@handler("all-reduce", "cross-replica-sum", "all-reduce-start")
def _all_reduce(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    red = L.reducer(ins, _AR_REDUCERS)
    v = _collective(L, ins, ops, loc, "all_reduce", {"reducer": red, "groups": L.groups(ins)},
                    ins.shape)
    return _Async(v) if ins.opcode.endswith("-start") else v


@handler("all-gather", "all-gather-start")
def _all_gather(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    dims = _ints(ins.attrs.get("dimensions"))
    if len(dims) != 1:
        raise L.err(ins, "all-gather needs dimensions={d}")
    result = ins.shape
    if ins.opcode.endswith("-start"):
        if not result.is_tuple or len(result.elements) != 2:
            raise L.err(ins, "all-gather-start result must be (operands, results)")
        result = result.elements[1]
    v = _collective(L, ins, ops, loc, "all_gather", {"dimension": dims[0], "groups": L.groups(ins)},
                    result)
    return _Async(v) if ins.opcode.endswith("-start") else v


@handler("reduce-scatter")
def _reduce_scatter(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                    loc: SourceLoc) -> Val:
    dims = _ints(ins.attrs.get("dimensions"))
    if len(dims) != 1:
        raise L.err(ins, "reduce-scatter needs dimensions={d}")
    red = L.reducer(ins, _AR_REDUCERS)
    return _collective(L, ins, ops, loc, "reduce_scatter",
                       {"dimension": dims[0], "reducer": red, "groups": L.groups(ins)}, ins.shape)


@handler("all-to-all")
def _all_to_all(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                loc: SourceLoc) -> Val:
    groups = L.groups(ins)
    dims = _ints(ins.attrs.get("dimensions"))
    if dims:
        if len(dims) != 1 or len(ops) != 1:
            raise L.unknown(ins, "all-to-all with several dimensions/operands")
        return _collective(L, ins, ops, loc, "all_to_all",
                           {"split_dimension": dims[0], "concat_dimension": dims[0],
                            "groups": groups}, ins.shape)
    # Tuple form: operand i goes to the i-th member of the group, result j comes
    # from member j. Exactly an array all-to-all over the operands stacked along
    # a leading dim, sliced apart again.
    ts = [L.tid(ins, v) for v in ops]
    k = len(ts)
    sizes = {len(g) for g in groups}
    shapes = {L.shape_of(t) for t in ts}
    dtypes = {L.dtype_of(t) for t in ts}
    if sizes != {k} or len(shapes) != 1 or len(dtypes) != 1:
        raise L.unknown(ins, "tuple all-to-all whose operands differ in shape or do not match the "
                             "group size is not expressible as an array all-to-all")
    (shape,), (dtype,) = shapes, dtypes
    pieces = [_reshape_to(L, ins, t, (1,) + shape, loc) for t in ts]
    stacked = L.emit("concatenate", pieces, (k,) + shape, dtype, {"dimension": 0}, loc, ins.name)
    moved = L.emit("all_to_all", [stacked], (k,) + shape, dtype,
                   {"split_dimension": 0, "concat_dimension": 0, "groups": groups}, loc, ins.name)
    outs = []
    for j in range(k):
        s = L.emit("slice", [moved], (1,) + shape, dtype,
                   {"start_indices": (j,) + (0,) * len(shape),
                    "limit_indices": (j + 1,) + shape, "strides": None}, loc, ins.name)
        outs.append(_reshape_to(L, ins, s, shape, loc))
    return tuple(outs)


@handler("collective-permute", "collective-permute-start")
def _permute(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
             loc: SourceLoc) -> Val:
    txt = ins.attrs.get("source_target_pairs") or "{}"
    pairs = [tuple(p) for p in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", txt)]
    pairs = [(int(a), int(b)) for a, b in pairs]
    R, P = L.R, L.P
    if R > 1 and P > 1:
        if "channel_id" in ins.attrs:
            pairs = [(r * P + a, r * P + b) for r in range(R) for a, b in pairs]
        else:
            pairs = [(a * P + p, b * P + p) for p in range(P) for a, b in pairs]
    for a, b in pairs:
        if not (0 <= a < L.ranks and 0 <= b < L.ranks):
            raise L.err(ins, f"source_target_pairs {{{a},{b}}} outside the {L.ranks} ranks")
    if len(ops) != 1:
        raise L.unknown(ins, "collective-permute with several operands (in-place form)")
    result = ins.shape
    if ins.opcode.endswith("-start"):
        if not result.is_tuple or len(result.elements) < 2:
            raise L.err(ins, "collective-permute-start result must be a tuple")
        result = result.elements[1]
    v = _collective(L, ins, ops, loc, "collective_permute", {"pairs": pairs}, result)
    return _Async(v) if ins.opcode.endswith("-start") else v


@handler("while")
def _while(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
           loc: SourceLoc) -> Val:
    cond = L.m.computations[(ins.attrs.get("condition") or "").lstrip("%")]
    body = L.m.computations[(ins.attrs.get("body") or "").lstrip("%")]
    if len(ops) != 1:
        raise L.err(ins, "while takes one (tuple) operand")
    state = ops[0]
    m = re.search(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)',
                  ins.attrs.get("backend_config") or "")
    declared = int(m.group(1)) if m else None
    trips = 0
    while True:
        # Evaluate the condition on the known values, then drop its ops again.
        n_ops, n_tensors = len(L.b.graph.ops), set(L.b.graph.tensors)
        c = L.tid(ins, L.run_comp(cond, [state], loc, ins), "while condition")
        value = L.known.get(c)
        del L.b.graph.ops[n_ops:]
        for t in set(L.b.graph.tensors) - n_tensors:
            del L.b.graph.tensors[t]
            L.known.pop(t, None)
        if value is None:
            if declared is None:
                raise L.unknown(ins, "while loop whose trip count is not statically known")
            go = trips < declared
            L.assume(f"while loop {ins.name} ({L.file}:{ins.line}) assumed to run {declared} times "
                     f"(its known_trip_count)")
        else:
            go = bool(np.asarray(value).reshape(-1)[0])
        if not go:
            return state
        trips += 1
        if trips > _MAX_UNROLL:
            raise L.unknown(ins, f"while loop runs more than {_MAX_UNROLL} iterations: not unrolled")
        state = L.run_comp(body, [state], loc, ins)


@handler("conditional")
def _conditional(L: _Lowerer, ins: HloInstruction, ops: list[Val], comp: HloComputation,
                 loc: SourceLoc) -> Val:
    sel = L.known.get(L.tid(ins, ops[0], "branch selector"))
    if sel is None:
        raise L.unknown(ins, "conditional whose branch is not statically known")
    if "branch_computations" in ins.attrs:
        names = [x.strip().lstrip("%") for x in ins.attrs["branch_computations"].strip("{}").split(",")]
        idx = int(np.asarray(sel).reshape(-1)[0])
        if not 0 <= idx < len(names):
            idx = len(names) - 1  # XLA: out-of-range index runs the last branch
    else:
        names = [ins.attrs["true_computation"].lstrip("%"), ins.attrs["false_computation"].lstrip("%")]
        idx = 0 if bool(np.asarray(sel).reshape(-1)[0]) else 1
    return L.run_comp(L.m.computations[names[idx]], [ops[1 + idx]], loc, ins)


def _flatten(v: Val) -> list[Val]:
    if isinstance(v, tuple):
        return [x for e in v for x in _flatten(e)]
    return [v]


@_single_line
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
    L = _Lowerer(module, b, ranks, custom_calls, instruction_frames)
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
        params.append(HloParam(k, ins.name, ins.shape.dims, ins.shape.dtype, t, ins.line,
                               sharding, relation))
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


def load_hlo(path: str, ids: IdAllocator, name: str, **kw: Any) -> tuple[Graph, HloInfo, HloModule]:
    """Read, parse and translate one HLO text file."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"cannot read HLO file: {e.strerror}", str(path)) from None
    except UnicodeDecodeError:
        raise InputError("not a text file (HLO text expected)", str(path)) from None
    module = parse_hlo_module(text, str(path))
    graph, info = hlo_to_graph(module, ids, name, **kw)
    return graph, info, module


__all__ = ["HloShape", "HloInstruction", "HloComputation", "HloModule", "HloSharding", "HloInfo",
           "HloParam", "parse_hlo_module", "hlo_to_graph", "load_hlo", "parse_replica_groups",
           "root_output_relations",
           "parse_sharding", "parse_iota_list", "FLAT_AXIS"]

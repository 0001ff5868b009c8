"""HLO text -> `HloModule` (frontends/hlo/model.py).

Reads the textual HLO format (as printed by `HloModule::ToString`,
`jax.jit(f).lower(..).as_text(dialect="hlo")`, `compiled.as_text()` or an XLA
dump): shapes parsed, attributes kept as raw text, operands resolved by name,
each computation in topological order. It copes with the old
`api_version=...` attribute, `/*index=5*/` comments, layouts, `%` or bare
names, and metadata strings of any length with escaped quotes. Malformed text
(truncated file, unknown opcode, bad shape, undefined operand, a result shape
that does not follow from its operands: frontends/hlo/validate.py) is an
`InputError` naming the file and the line of the offending instruction.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Callable

from dlverify.frontends.hlo.model import (
    CALL_ATTRS,
    DTYPES,
    KNOWN_OPCODES,
    MAX_DIM,
    MAX_ELEMENTS,
    MAX_RANKS,
    MAX_TUPLE_DEPTH,
    FrameTables,
    HloComputation,
    HloInstruction,
    HloModule,
    HloShape,
)
from dlverify.frontends.hlo.text import (
    ATTR_KEY,
    DTYPE_TOKEN,
    NAME,
    OPCODE_TOKEN,
    Cursor,
    split_top,
    strip_comments_and_depth,
    unescape,
)
from dlverify.frontends.hlo.validate import same_shape, validate_module

from dlverify.errors import InputError, UnknownOpError


def parse_shape(c: Cursor) -> HloShape:
    """An array shape `f32[2,3]{1,0}` or a (nested) tuple of shapes. Iterative:
    tuple nesting costs no stack; deeper than MAX_TUPLE_DEPTH is an error."""
    open_tuples: list[list[HloShape]] = []  # elements read so far of each open tuple
    while True:
        c.ws()
        if c.eat("("):
            if len(open_tuples) >= MAX_TUPLE_DEPTH:
                raise c.error(f"tuple shape nested deeper than {MAX_TUPLE_DEPTH} levels")
            if not c.eat(")"):
                open_tuples.append([])
                continue
            shape = HloShape("tuple", elements=())
        else:
            shape = _parse_array_shape(c)
        while open_tuples:
            open_tuples[-1].append(shape)
            if not c.eat(")"):
                c.expect(",", "',' or ')' in a tuple shape")
                break
            shape = HloShape("tuple", elements=tuple(open_tuples.pop()))
        else:
            return shape


def _parse_array_shape(c: Cursor) -> HloShape:
    start = c.i
    et = c.regex(DTYPE_TOKEN)
    if et is None:
        raise c.error(f"bad shape {c.s[start:start + 30]!r}: expected an element type such as f32[...]")
    if et not in DTYPES:
        raise c.error(f"bad shape: unknown element type {et!r}")
    dims_txt = c.balanced()
    dims = []
    for d in (x.strip() for x in dims_txt.split(",")) if dims_txt.strip() else ():
        if d.startswith("<=") or d == "?":
            raise c.error(f"dynamic dimension {d!r} in shape {et}[{dims_txt}] is not supported")
        if not re.fullmatch(r"\d+", d):
            raise c.error(f"bad shape {et}[{dims_txt}]: dimension {d!r} is not a non-negative integer")
        if len(d) > 12 or int(d) > MAX_DIM:
            raise c.error(f"shape {et}[{dims_txt}]: dimension {d} exceeds the supported "
                          f"maximum of {MAX_DIM} (2^31)")
        dims.append(int(d))
    count = 1
    for d in dims:
        count *= d
    if count > MAX_ELEMENTS:
        raise c.error(f"shape {et}[{dims_txt}] holds {count} elements, more than the supported "
                      f"{MAX_ELEMENTS} (2^40)")
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
    return HloShape(DTYPES[et], tuple(dims), layout)


def _parse_attrs(c: Cursor) -> dict[str, str]:
    attrs: dict[str, str] = {}
    prev = None
    while not c.at_end():
        c.expect(",", "',' before an attribute")
        key = c.regex(ATTR_KEY)
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


def _parse_signature(c: Cursor, named: bool = True) -> tuple[list[HloShape], HloShape] | None:
    """The `(name: shape, ...) -> shape` after a computation's name (None when the
    header prints none), or with `named` False the `(shape, ...) -> shape` of the
    module's entry_computation_layout: the parameter shapes in order and the result."""
    c.ws()
    if not c.eat("("):
        return None
    params: list[HloShape] = []
    c.ws()
    if not c.eat(")"):
        while True:
            c.ws()
            if named:
                if c.regex(NAME) is None:
                    raise c.error("bad computation signature: expected a parameter name")
                c.ws()
                c.expect(":", "':' after a parameter name in the computation signature")
            params.append(parse_shape(c))
            c.ws()
            if c.eat(")"):
                break
            c.expect(",", "',' or ')' in the computation signature")
    c.ws()
    c.expect("->", "'->' and the result shape in the computation signature")
    return params, parse_shape(c)


def _check_signature(cname: str, signature: tuple[list[HloShape], HloShape], comp: HloComputation,
                     file: str, line: int, at_line: bool = False) -> None:
    """The header's signature must be the one the body has (XLA rejects a module
    whose computation says one thing and does another): as many parameters, each of
    its declared shape, and the ROOT's shape as the result. A mismatch is reported at
    the parameter or ROOT it concerns, or with `at_line` at `line` (the module header's
    entry_computation_layout: the header is what is wrong there)."""
    params, result = signature
    body = comp.parameters()
    if len(body) != len(params):
        raise InputError(f"computation {cname}: its signature has {len(params)} parameters, its "
                         f"body {len(body)}", file, line)
    for k, shape in enumerate(params):
        ins = body.get(k)
        if ins is not None and not same_shape(ins.shape, shape):
            raise InputError(f"computation {cname}: parameter {k} is {shape} in the signature but "
                             f"{ins.name} is {ins.shape}", file, line if at_line else ins.line)
    if not same_shape(comp.root.shape, result):
        raise InputError(f"computation {cname}: the signature returns {result} but ROOT "
                         f"{comp.root.name} is {comp.root.shape}", file,
                         line if at_line else comp.root.line)


def _parse_instruction(text: str, file: str, line: int) -> HloInstruction:
    c = Cursor(text, file, line)
    is_root = False
    if c.s.lstrip().startswith("ROOT ") or c.s.lstrip().startswith("ROOT%"):
        c.eat("ROOT")
        is_root = True
    name = c.regex(NAME)
    if name is None:
        raise c.error(f"expected an instruction 'name = shape opcode(...)', found {text[:40]!r}")
    name = name.lstrip("%")
    c.expect("=", "'=' after the instruction name")
    shape = parse_shape(c)
    opcode = c.regex(OPCODE_TOKEN)
    if opcode is None:
        raise c.error(f"instruction {name}: expected an opcode and '(' after the shape, found "
                      f"{c.s[c.i:c.i + 30]!r}")
    if opcode not in KNOWN_OPCODES:
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
    for key in CALL_ATTRS:
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
        val = unescape(rest[1:-1])
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


def single_line(fn: Callable[..., Any]) -> Callable[..., Any]:
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


@single_line
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
    signatures: list = []   # (name, signature, line) of each computation that prints one
    table: str | None = None

    def logical(start: int) -> tuple[str, int]:
        """Join physical lines from `start` until brackets balance; return the
        text and the index of the next line."""
        parts, depth, in_str = [], 0, False
        j = start
        while j < n:
            clean, depth, in_str = strip_comments_and_depth(lines[j], depth, in_str)
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
        head, depth, in_str = strip_comments_and_depth(raw, 0, False)
        if not head.rstrip().endswith("{") or depth != 1:
            raise InputError(f"unexpected text at top level: {stripped[:60]!r} (expected a "
                             f"computation 'name (...) -> shape {{')", file, i + 1)
        comp_line = i + 1
        hc = Cursor(head, file, comp_line)
        is_entry = hc.eat("ENTRY ")
        cname = hc.regex(NAME)
        if cname is None:
            raise InputError(f"bad computation header {stripped[:60]!r}", file, comp_line)
        cname = cname.lstrip("%")
        signature = _parse_signature(hc)
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
        if signature is not None:
            signatures.append((cname, signature, comp_line))
        comps[cname] = HloComputation(cname, order, seen, root, comp_line, is_entry)
        if is_entry:
            if entry_name is not None:
                raise InputError("two ENTRY computations", file, comp_line)
            entry_name = cname
    if header is None:
        raise InputError("empty file: expected 'HloModule <name>'", file, 1)
    hcur = Cursor(header.strip(), file, header_line)
    hcur.expect("HloModule", "'HloModule'")
    mname = hcur.regex(NAME) or ""
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
    module = HloModule(mname.lstrip("%"), file, attrs, comps, entry, tables)
    _check_rank_counts(module, header_line)
    validate_module(module)
    for cname, signature, comp_line in signatures:   # after the instructions' own checks
        _check_signature(cname, signature, comps[cname], file, comp_line)
    layout = attrs.get("entry_computation_layout")
    if layout is not None:   # the header's copy of the ENTRY signature
        lc = Cursor(layout.strip().removeprefix("{").removesuffix("}"), file, header_line)
        _check_signature(f"{entry.name} (entry_computation_layout of the header)",
                         _parse_signature(lc, named=False) or ([], HloShape("tuple")), entry,
                         file, header_line, at_line=True)
    return module


def _check_rank_counts(module: HloModule, line: int) -> None:
    """num_partitions and replica_count are positive and their product is at
    most MAX_RANKS (every rank's groups and blocks are materialised)."""
    total = 1
    for key in ("num_partitions", "replica_count"):
        text = module.attrs.get(key)
        if text is None:
            continue
        if not re.fullmatch(r"\s*\d{1,12}\s*", text) or int(text) < 1:
            raise InputError(f"{key}={text.strip()[:40]} is not a positive integer", module.file,
                             line)
        total *= int(text)
    if total > MAX_RANKS:
        raise InputError(f"num_partitions * replica_count = {total} ranks: the supported maximum "
                         f"is {MAX_RANKS}", module.file, line)


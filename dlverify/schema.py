"""Every fact relation exchanged between Python and Datalog, declared once.

`datalog/schema.dl` is generated from this module (`python -m dlverify.schema`)
and a test fails when the checked-in file is stale. Python code refers to
relations only through the constants below, never through raw strings.

Conventions: relations are UpperCamel `Entity_Attribute`; tensor and op ids are
global integers (sequential and distributed graphs share one id space, so a
tensor id says which program it belongs to); ranks are integers 0..N-1.
Offsets lists are records `[head, tail]` ending in `nil`, outermost dim first;
an offset of -1 is a wildcard ("any offset": the sequential tensor is constant
along that dim). Scales are exact rationals 2^e2 3^e3 5^e5 7^e7.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["input", "output"]

# Soufflé type declarations, in dependency order. Record types map to clingo tuples.
TYPES: tuple[tuple[str, str, str], ...] = (
    ("TensorId", "<: number", "A tensor of either program (ids are globally unique)."),
    ("OpId", "<: number", "An op of either program."),
    ("Rank", "<: number", "A rank (device position) of the distributed program."),
    ("ValueId", "<: number", "An interned exact scalar value (see Value_Int, Value_Ratio)."),
    ("OffList", "= [head: number, tail: OffList]",
     "Offsets of a block, outermost dim first; -1 is a wildcard; nil ends the list."),
    ("Scale", "= [e2: number, e3: number, e5: number, e7: number]",
     "The exact positive rational 2^e2 * 3^e3 * 5^e5 * 7^e7."),
    ("Tag", "= [reducer: number, op: OpId, axis: number, lo: number, hi: number]",
     "A partial term: the index range [lo,hi) of reduced axis `axis` of sequential op `op`, "
     "to be combined with `reducer` (0 sum, 1 max, 2 min); nil when the view is complete."),
    ("Key", "= [family: number, a: OffList, b: OffList]",
     "Identifies one derivation of a view built dim by dim: the rule family and the "
     "operands' offsets."),
)

TYPE_NAMES = frozenset(t[0] for t in TYPES) | {"number", "symbol"}

# How the terms of a partial value combine: the `reducer` column of Tag,
# Reduce_Axis and AllReduce. A reducer's code is its position here.
REDUCERS = ("sum", "max", "min")
REDUCER_CODE = {name: code for code, name in enumerate(REDUCERS)}
REDUCER_SUM, REDUCER_MAX, REDUCER_MIN = (REDUCER_CODE[n] for n in REDUCERS)
# The identity of each reducer: the padding a reduction ignores (Value_Identity, Pad_View).
REDUCER_IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}


def reducer_name(code: int) -> str:
    return REDUCERS[code]


SCALE_PRIMES = (2, 3, 5, 7)
UNIT_SCALE = (0,) * len(SCALE_PRIMES)  # the Scale record of 1


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    doc: str = ""


@dataclass(frozen=True)
class Relation:
    name: str
    columns: tuple[Column, ...]
    doc: str
    role: Role = "input"

    @property
    def arity(self) -> int:
        return len(self.columns)

    def column_index(self, name: str) -> int:
        """The position of column `name` in a row of this relation."""
        for i, c in enumerate(self.columns):
            if c.name == name:
                return i
        raise KeyError(f"{self.name} has no column {name!r}")

    def row(self, **values: object) -> tuple:
        """A row with every column given by name, in declaration order."""
        missing = [c.name for c in self.columns if c.name not in values]
        extra = set(values) - {c.name for c in self.columns}
        if missing or extra:
            raise KeyError(f"{self.name} row: missing {missing}, unknown {sorted(extra)}")
        return tuple(values[c.name] for c in self.columns)


def _rel(name: str, doc: str, *cols: str, role: Role = "input") -> Relation:
    """`cols` are "name:Type" strings."""
    columns = []
    for c in cols:
        n, t = c.split(":")
        assert t in TYPE_NAMES, (name, t)
        columns.append(Column(n, t))
    return Relation(name, tuple(columns), doc, role)


# ---------------------------------------------------------------- graph structure
SEQ_TENSOR = _rel("SeqTensor", "t is a tensor of the sequential program.", "t:TensorId")
DIST_TENSOR = _rel("DistTensor", "t is a tensor of the distributed (SPMD) program.", "t:TensorId")
TENSOR_RANK = _rel("Tensor_Rank", "Tensor t has n dims.", "t:TensorId", "n:number")
TENSOR_DIM = _rel("Tensor_Dim", "Dim i of tensor t has `size` elements.",
                  "t:TensorId", "i:number", "size:number")
OP_SIG = _rel("Op_Sig", "Ops with equal sig have the same kind and the same shape-independent "
              "params, so a sequential and a distributed op with equal sig compute the same "
              "function of their operands.", "op:OpId", "sig:number")
OP_INPUT = _rel("Op_Input", "Operand `pos` of op is tensor t.", "op:OpId", "pos:number", "t:TensorId")
OP_OUTPUT = _rel("Op_Output", "Op produces tensor t.", "op:OpId", "t:TensorId")

# ---------------------------------------------------------------- op classes
ELEM_UNARY = _rel("Elem_Unary", "Op is an elementwise unary op that is not linear.", "op:OpId")
ELEM_UNARY_LINEAR = _rel("Elem_UnaryLinear", "Op is an elementwise unary linear op (neg).", "op:OpId")
ELEM_NARY = _rel("Elem_Nary", "Op is an elementwise op of `n` operands that is not linear "
                 "(max, comparisons, select_n, ...).", "op:OpId", "n:number")
ELEM_EXTREMUM = _rel("Elem_Extremum", "Op is elementwise max or min, with the code of that "
                     "reducer (max 1, min 2).", "op:OpId", "reducer:number")
SELECT = _rel("Select", "Op is select_n: operand 0 holds the index n of the case it takes, "
              "operand n + 1.", "op:OpId")
ELEM_ADDSUB = _rel("Elem_AddSub", "Op is elementwise add (sign 1) or sub (sign -1): linear in "
                   "both operands.", "op:OpId", "sign:number")
ELEM_MUL = _rel("Elem_Mul", "Op is elementwise mul (linear in each operand).", "op:OpId")
ELEM_DIV = _rel("Elem_Div", "Op is elementwise div (linear in its numerator).", "op:OpId")
SIG_ZERO = _rel("Sig_Zero", "Elementwise ops of signature g map all-zero operands to zero (their "
                "value at zero, computed by the shared evaluator).", "g:number")
MASK_PREFIX = _rel("Mask_Prefix", "On rank r, bool distributed tensor t is b (1 true, 0 false) at "
                   "the indices below n along dim j and the opposite at the others, alike along "
                   "every other dim.", "t:TensorId", "r:Rank", "j:number", "n:number", "b:number")

# ---------------------------------------------------------------- op params
BROADCAST = _rel("Broadcast", "Op is broadcast_in_dim.", "op:OpId")
BROADCAST_DIM = _rel("Broadcast_Dim", "broadcast_in_dim maps operand dim i to output dim j "
                     "without expanding it; i = -1 for an output dim that is new or expanded "
                     "from size 1.", "op:OpId", "i:number", "j:number")
TRANSPOSE = _rel("Transpose", "Op is transpose.", "op:OpId")
TRANSPOSE_PERM = _rel("Transpose_Perm", "transpose: output dim j is operand dim i.",
                      "op:OpId", "j:number", "i:number")
REV_DIM = _rel("Rev_Dim", "rev: operand dim i is reversed (flag 1) or kept (flag 0); one row per dim.",
               "op:OpId", "i:number", "flag:number")
RESHAPE = _rel("Reshape", "Op is reshape.", "op:OpId")
RESHAPE_MAP = _rel("Reshape_Map", "reshape: output dim j takes its offset from operand dim i "
                   "divided by k (k=1: copied; k>1: the first dim of a split group); "
                   "mode 1: multiplied by k (a merge group); mode 2: always 0.",
                   "op:OpId", "j:number", "mode:number", "i:number", "k:number")
SLICE_START = _rel("Slice_Start", "slice (unit strides) starts at `start` in dim i.",
                   "op:OpId", "i:number", "start:number")
DYNSLICE_START = _rel("DynSlice_Start", "dynamic_slice on rank r starts at `start` in dim i "
                      "(start operands folded to constants, clamped as XLA does).",
                      "op:OpId", "r:Rank", "i:number", "start:number")
RESHAPE_CHAIN = _rel("Reshape_Chain", "The output of op is a row-major reshape of tensor x: op "
                     "ends a chain of reshape-like ops from x (reshapes, broadcasts inserting size-1 "
                     "dims only, reductions over size-1 dims only, transposes keeping the order of "
                     "the dims with more than one element).", "op:OpId", "x:TensorId")
RESHAPE_SAME = _rel("Reshape_Same", "Reshape_Chain(op, x) with op's output of x's shape: it equals x.",
                    "op:OpId", "x:TensorId")
RESHAPE_END_DIM = _rel("Reshape_End_Dim", "Dim i of the value op's reshape chains end in has n "
                       "elements: op's output, or for a broadcast_in_dim that expands, its operand "
                       "with the new dims inserted as size 1.", "op:OpId", "i:number", "n:number")
BROADCAST_EXPANDS = _rel("Broadcast_Expands", "broadcast_in_dim op expands dim j of its chain end "
                         "(Reshape_End_Dim, size 1) to its output's size.", "op:OpId", "j:number")
RESHAPE_CUT = _rel("Reshape_Cut", "Distributed Reshape_Chain(op, x): the first i dims of x and the "
                   "first j dims of op's output have equal size products (a group may end there).",
                   "op:OpId", "x:TensorId", "i:number", "j:number")
RESHAPE_GROUP = _rel("Reshape_Group", "Sequential Reshape_Chain(op, x), group g of n: dims [i0, i1) "
                     "of x reshape to output dims [j0, j1) (its finest chain of cuts).",
                     "op:OpId", "x:TensorId", "g:number", "i0:number", "i1:number", "j0:number",
                     "j1:number", "n:number")
RESHAPE_DIM = _rel("Reshape_Dim", "Sequential Reshape_Chain(op, x): dim i of x (side 0) or of the "
                   "output (side 1) is in group g with row-major stride `stride` inside the group; "
                   "`prev` is the previous dim of the group with more than one element (-1: none).",
                   "op:OpId", "x:TensorId", "side:number", "i:number", "g:number", "stride:number",
                   "prev:number")
PAD_DIM = _rel("Pad_Dim", "pad (no interior padding, none negative) adds lo elements before and "
               "hi after dim i.", "op:OpId", "i:number", "lo:number", "hi:number")
UPDATE_WHOLE = _rel("Update_Whole", "dynamic_update_slice whose update has the operand's shape: "
                    "the start is clamped to 0, so the result is the update.", "op:OpId")
UPDATE_ALONG = _rel("Update_Along", "dynamic_update_slice whose update is smaller than the operand "
                    "only along dim k (its start operand 2 + k; the other starts clamp to 0), "
                    "whatever the starts' values.", "op:OpId", "k:number")
UPDATE_WINDOW = _rel("Update_Window", "dynamic_update_slice on rank r (0: sequential) writes its update "
                     "at `start` along dim k, the only dim where the update is smaller than the "
                     "operand (starts folded to constants, clamped as XLA does).",
                     "op:OpId", "r:Rank", "k:number", "start:number")
UPDATE_CELL = _rel("Update_Cell", "dynamic_update_slice on rank r writes its update at `a_out` "
                   "along dim k_out, where the update has one element, and at `a_in` along "
                   "dim k_in: the only two dims where the update is smaller than the operand "
                   "(starts folded to constants, clamped as XLA does).",
                   "op:OpId", "r:Rank", "k_out:number", "a_out:number", "k_in:number",
                   "a_in:number")
CONCAT_DIM = _rel("Concat_Dim", "concatenate along dim k.", "op:OpId", "k:number")
CONCAT_OFFSET = _rel("Concat_Offset", "Operand `pos` of concatenate starts at `off` along the "
                     "concat dim; n operands in all.", "op:OpId", "pos:number", "off:number",
                     "n:number")
IOTA_DIM = _rel("Iota_Dim", "Op is an iota counting along dim k.", "op:OpId", "k:number")
MOVES_DATA = _rel("Moves_Data", "Every output element of op is an element of one of its first n "
                  "operands (layout ops that only move elements).", "op:OpId", "n:number")
KNOWN_CONST = _rel("Known_Const", "Op is a constant whose value is known (written in the program), "
                   "or a distributed integer or bool op whose value on every rank is known before "
                   "run time (index arithmetic on constants, iotas and the rank).", "op:OpId")
IOTA_ALONG = _rel("Iota_Along", "Sequential tensor s holds its own index along dim k (an iota, or a "
                  "broadcast of one).", "s:TensorId", "k:number")
DOT = _rel("Dot", "Op is dot_general with n contracting dim pairs.", "op:OpId", "n:number")
DOT_CONTRACT = _rel("Dot_Contract", "dot_general contracting pair `idx` is lhs dim l with rhs "
                    "dim r.", "op:OpId", "idx:number", "l:number", "r:number")
DOT_OUT = _rel("Dot_Out", "dot_general output dim j is dim i of operand `operand` (0 lhs, 1 rhs); "
               "for batch dims the matching rhs dim is `other` (else -1).",
               "op:OpId", "j:number", "operand:number", "i:number", "other:number")
REDUCE_AXIS = _rel("Reduce_Axis", "Reduction over operand dim `axis`, the idx-th of n reduced "
                   "dims; `reducer` 0 sum, 1 max, 2 min, -1 a reduction related only over "
                   "whole axes (prod, and/or/xor, argmax/argmin).", "op:OpId", "idx:number", "axis:number",
                   "n:number", "reducer:number")
ALONG_AXIS = _rel("Along_Axis", "Op (a cumulative scan or a sort) processes each row along "
                  "operand dim `axis` alone and keeps every dim.", "op:OpId", "axis:number")
WHOLE_FN = _rel("Whole_Fn", "Op is a deterministic function of its whole operands, known only "
               "by its signature (rng_bit_generator).", "op:OpId")
ALONG_LINEAR = _rel("Along_Linear", "Op is a scan that is linear in its operand (cumsum).",
                    "op:OpId")
REDUCE_OUT = _rel("Reduce_Out", "Reduction output dim j is operand dim i.", "op:OpId", "j:number",
                  "i:number")
SUM_PART = _rel("Sum_Part", "Sequential tensor s is a node (a leaf, or an add) of the sum tree of "
                "add op `root` (dlverify/sum_trees.py) and sums the leaves whose positions are the "
                "bits of `mask`, n of them.", "root:OpId", "s:TensorId", "mask:number", "n:number")
CONTRACT_SIZE = _rel("Contract_Size", "Reduced axis `axis` of sequential op has `size` elements.",
                     "op:OpId", "axis:number", "size:number")
PROD_ROOT = _rel("Prod_Root", "Reduction p is the one reduction nearest upstream of sequential s "
                 "(dlverify/partial_tags.py: prod_roots): the family a partial view of s carries "
                 "is named by s alone.", "s:TensorId", "p:OpId")

# ---------------------------------------------------------------- gather
GATHER = _rel("Gather", "Op is a gather without batching dims whose operand dims outside "
              "start_index_map are sliced whole; n operand dims are indexed, and `vec` is the "
              "index vector dim of the indices (-1: implicit, the indices' rank).",
              "op:OpId", "n:number", "vec:number")
GATHER_INDEXED = _rel("Gather_Indexed", "gather: operand dim i is the idx-th of the n dims "
                      "in start_index_map.", "op:OpId", "idx:number", "i:number")
GATHER_OFFSET = _rel("Gather_Offset", "gather: output dim j is operand dim i (not collapsed); "
                     "indexed = 1 when i is in start_index_map.", "op:OpId", "j:number",
                     "i:number", "indexed:number")
GATHER_BATCHING = _rel("Gather_Batching", "gather has n batching dim pairs (take_along_axis: "
                       "Gather_OBatch).", "op:OpId", "n:number")
GATHER_OBATCH = _rel("Gather_OBatch", "gather batching pair idx: operand dim i is read at the "
                     "position of indices dim k (a slice of one element).", "op:OpId", "idx:number",
                     "i:number", "k:number")
GATHER_BATCH = _rel("Gather_Batch", "gather: output dim j is dim k of the indices.",
                    "op:OpId", "j:number", "k:number")

# ---------------------------------------------------------------- collectives
COLL_MEMBER = _rel("Coll_Member", "Rank r is member `idx` of group g of collective op; "
                   "groups have n members.", "op:OpId", "g:number", "idx:number", "r:Rank",
                   "n:number")
ALL_REDUCE = _rel("AllReduce", "Op is an all-reduce with `reducer` (0 sum, 1 max, 2 min).",
                  "op:OpId", "reducer:number")
ALL_GATHER = _rel("AllGather", "Op is an all-gather concatenating along dim k.", "op:OpId", "k:number")
REDUCE_SCATTER = _rel("ReduceScatter", "Op is a summing reduce-scatter along dim k.",
                      "op:OpId", "k:number")
ALL_TO_ALL = _rel("AllToAll", "Op is an all-to-all splitting dim a and concatenating dim b.",
                  "op:OpId", "a:number", "b:number")
PERMUTE_PAIR = _rel("Permute_Pair", "collective_permute sends rank src's operand to rank dst.",
                    "op:OpId", "src:Rank", "dst:Rank")
GROUP_SCALE = _rel("Group_Scale", "The group size of collective op as a Scale "
                   "(present when every group has the same, representable, size).",
                   "op:OpId", "e2:number", "e3:number", "e5:number", "e7:number")

# ---------------------------------------------------------------- constants
SEQ_SPLAT = _rel("Seq_Splat", "Sequential tensor t holds the value v in every element.",
                 "t:TensorId", "v:ValueId")
DIST_SPLAT = _rel("Dist_Splat", "Distributed tensor t holds value v in every element on rank r.",
                  "t:TensorId", "r:Rank", "v:ValueId")
VALUE_INT = _rel("Value_Int", "Value v is the integer n.", "v:ValueId", "n:number")
VALUE_IDENTITY = _rel("Value_Identity", "Value v is the identity of reducer `red` (0 of sum, -inf of "
                      "max, +inf of min).", "v:ValueId", "red:number")
VALUE_RATIO = _rel("Value_Ratio", "Value a divided by value b is 2^e2 3^e3 5^e5 7^e7.",
                   "a:ValueId", "b:ValueId", "e2:number", "e3:number", "e5:number", "e7:number")
VALUE_EXP = _rel("Value_Exp", "Value v is the positive rational 2^e2 3^e3 5^e5 7^e7.",
                 "v:ValueId", "e2:number", "e3:number", "e5:number", "e7:number")
RANK_COUNT = _rel("Rank_Count", "The distributed program runs on n ranks.", "n:number")

# ---------------------------------------------------------------- relations at the boundary
SEED = _rel("Seed", "View seed `id`: on rank r, d equals 2^e2 3^e3 5^e5 7^e7 times the block of s "
            "(offsets in Seed_Off); when red >= 0 it is only the partial term [red, op, axis, lo, hi]. "
            "Seeds are the input relations, and the views carried into a segment from earlier ones.",
            "id:number", "s:TensorId", "d:TensorId", "r:Rank", "red:number", "op:OpId", "axis:number",
            "lo:number", "hi:number", "e2:number", "e3:number", "e5:number", "e7:number")
SEED_OFF = _rel("Seed_Off", "Dim i of the block of seed `id` starts at `off` (-1: any).",
                "id:number", "i:number", "off:number")
PAD_SEED = _rel("Pad_Seed", "Padded view seed `id`: on rank r, element i of d is element o + i of s "
                "where that lies inside s (offsets o in Pad_Seed_Off), elsewhere padding z as in "
                "Pad_View. Carried into a segment from earlier ones, as Seed carries View.",
                "id:number", "s:TensorId", "d:TensorId", "r:Rank", "z:number")
PAD_SEED_OFF = _rel("Pad_Seed_Off", "Dim i of the padded block of seed `id` starts at `off`.",
                    "id:number", "i:number", "off:number")
OUTPUT_PAIR = _rel("Output_Pair", "Output number idx: sequential s is rebuilt from distributed d.",
                   "s:TensorId", "d:TensorId", "idx:number")
OUTPUT_OFF = _rel("Output_Off", "The expected relation: on rank r, dim i of output d is the block "
                  "of s starting at `off`.", "s:TensorId", "d:TensorId", "r:Rank", "i:number",
                  "off:number")

# ---------------------------------------------------------------- derived, read by Python
VIEW = _rel("View", "On rank r, distributed tensor d equals c times (a term p of) the block of "
            "sequential tensor s at offsets o (the block's sizes are d's shape).",
            "s:TensorId", "d:TensorId", "r:Rank", "o:OffList", "p:Tag", "c:Scale", role="output")
PAD_VIEW = _rel("Pad_View", "On rank r, element i of distributed tensor d is element o + i of "
                "sequential tensor s where o + i lies inside s, and elsewhere unknown (z = 0) or the "
                "identity of reducer z - 1 (z = 1: zero, 2: -inf, 3: +inf): the block may run past "
                "s's end (padded shards, datalog/padded.dl).",
                "s:TensorId", "d:TensorId", "r:Rank", "o:OffList", "z:number", role="output")
OUTPUT_OK = _rel("Output_Ok", "On rank r, output d holds exactly the block of s the expected "
                 "relation asks for.", "s:TensorId", "d:TensorId", "r:Rank", role="output")
SEQ_FRONTIER = _rel("Seq_Frontier", "Sequential op whose operands all have views but whose "
                    "output has none.", "op:OpId", role="output")
DIST_FRONTIER = _rel("Dist_Frontier", "Distributed op whose operands all have views on rank r "
                     "but whose output has none there.", "op:OpId", "r:Rank", role="output")

RELATIONS: tuple[Relation, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Relation))
INPUTS = tuple(r for r in RELATIONS if r.role == "input")
OUTPUTS = tuple(r for r in RELATIONS if r.role == "output")
BY_NAME = {r.name: r for r in RELATIONS}
assert len(BY_NAME) == len(RELATIONS), "duplicate relation name"


# ---------------------------------------------------------------- constants shared with the rules
# The rule subset has no `#define`, so each named constant is generated as a
# relation holding one fact, which a rule joins to read the value.

@dataclass(frozen=True)
class Constant:
    name: str       # the relation holding the one fact
    column: Column
    value: int | tuple[int, ...]
    doc: str

    def literal(self) -> str:
        if isinstance(self.value, tuple):
            return "[" + ", ".join(str(v) for v in self.value) + "]"
        return str(self.value)


def _const(name: str, col: str, value: int | tuple[int, ...], doc: str) -> Constant:
    n, t = col.split(":")
    assert t in TYPE_NAMES, (name, t)
    return Constant(name, Column(n, t), value, doc)


@dataclass(frozen=True)
class RuleFamily:
    """A rule family that builds views dim by dim through the assembler of
    views.dl: its key is the `family` field of the Key record."""

    key: int
    const: Constant
    file: str                  # the rule file under datalog/
    ops: frozenset[str]        # the op kinds whose outputs it derives views of
    title: str


def _family(key: int, name: str, file: str, ops: str, title: str) -> RuleFamily:
    return RuleFamily(key, _const(name, "k:number", key, f"Key family {key}: {title} ({file})."),
                      file, frozenset(ops.split()), title)


UNIT = _const("Unit_Scale", "c:Scale", UNIT_SCALE, "The Scale 1: the value is not scaled.")
REDUCER_CONSTANTS = tuple(
    _const(f"Reducer_{name.capitalize()}", "red:number", code,
           f"The reducer code of {name} (a Tag's and Reduce_Axis's `reducer`).")
    for name, code in REDUCER_CODE.items())
REDUCER_SUM_CONST = REDUCER_CONSTANTS[REDUCER_SUM]

# The `axis` field of a partial tag names the family of terms (dlverify/partial_tags.py):
# below TAG_FLAT_BASE a reduced axis; above, pairs of axes (each below TAG_PAIR) or a dim.
TAG_FLAT_BASE, TAG_ADD_BASE, TAG_MASK_BASE, TAG_WINDOW_BASE, TAG_PAIR = 1000, 2000, 3000, 4000, 32
# TAG_ACC_BASE + a: a tree of adds on both sides whose leaves reduce axis a (partials.dl).
TAG_ACC_BASE = 5000
# TAG_CAT_BASE + a: a concatenation of reductions along their axis a (concat_terms.dl).
TAG_CAT_BASE = 6000
# TAG_CAT_MIXED_BASE + sum_j a_j * RADIX^j: a concatenation of reductions with equally many
# terms, operand j along its own axis a_j < RADIX (concat_terms.dl); codes below
# TAG_HELD_BASE (up to four operands).
TAG_CAT_MIXED_BASE, TAG_CAT_MIXED_RADIX = 6100, 4
# TAG_HELD_BASE + PAIR * i + a: an add whose operand i is the reduction along axis a and
# whose other operand is held by the rank of term 0 (partials.dl).
TAG_HELD_BASE = 7000
# TAG_MASK2_BASE + PAIR * k_out + k_in: an output masked to one index along dim k_out and
# one along k_in, the pairs flattened row-major with k_out outer (update.dl).
TAG_MASK2_BASE = 8000
# TAG_PROD_BASE + ((n * PROD_AXES + i) * 3 + t) * PROD_AXES + a: a contraction holding one
# aligned block of n indices of its partially held pair i, times the family (its
# reduction, a) of its operand t (t < 2) that is itself partial, or times the range its
# own pair a holds (t = 2): the two families' product, flattened with the blocks outer
# (partials.dl); i and a are below PROD_AXES, and the code below TAG_GROUP_BASE (blocks
# of up to 468 indices).
TAG_PROD_BASE, TAG_PROD_AXES = 10000, 8
# Above TAG_GROUP_BASE: a class of groups of a collective (the tag's op): GROUP_BASE +
# (first * RADIX + stride) * RADIX + count (dlverify/partial_tags.py).
TAG_GROUP_BASE, TAG_GROUP_RADIX = 100000, 512
# Above TAG_TRANS_BASE: a reduced axis re-indexed by a transpose of its blocks:
# TRANS_BASE + (block * TRANS_RADIX + stride) * TAG_PAIR + axis, block < TRANS_BLOCKS.
TAG_TRANS_BASE, TAG_TRANS_RADIX, TAG_TRANS_BLOCKS = 200_000_000, 1024, 59000
TAG_CONSTANTS = (
    _const("Tag_FlatBase", "base:number", TAG_FLAT_BASE,
           "Tag axis base: a dot_general's two partial contracted pairs, flattened."),
    _const("Tag_AddBase", "base:number", TAG_ADD_BASE,
           "Tag axis base: an add/sub of the partial results of two reductions."),
    _const("Tag_MaskBase", "base:number", TAG_MASK_BASE,
           "Tag axis base: an output masked to one index along a dim."),
    _const("Tag_WindowBase", "base:number", TAG_WINDOW_BASE,
           "Tag axis base: a sequential dynamic_update_slice's window along a dim."),
    _const("Tag_Pair", "m:number", TAG_PAIR, "Axes encoded in pairs in a tag axis are below m."),
    _const("Tag_AccBase", "base:number", TAG_ACC_BASE,
           "Tag axis base: a tree of adds whose leaves are reductions along one axis."),
    _const("Tag_CatBase", "base:number", TAG_CAT_BASE,
           "Tag axis base: a concatenation of reductions along one axis with equally many terms."),
    _const("Tag_CatMixedBase", "base:number", TAG_CAT_MIXED_BASE,
           "Tag axis base: a concatenation of reductions with equally many terms, each "
           "operand along its own axis, the axes coded in radix Tag_CatMixedRadix."),
    _const("Tag_CatMixedRadix", "k:number", TAG_CAT_MIXED_RADIX,
           "A mixed concatenation's operand axes are below k."),
    _const("Tag_HeldBase", "base:number", TAG_HELD_BASE,
           "Tag axis base: the terms of a reduction plus a value held with its term 0."),
    _const("Tag_Mask2Base", "base:number", TAG_MASK2_BASE,
           "Tag axis base: an output masked to one index along each of two dims."),
    _const("Tag_ProdBase", "base:number", TAG_PROD_BASE,
           "Tag axis base: a block of a contracted pair times an operand's or a pair's terms."),
    _const("Tag_ProdAxes", "k:number", TAG_PROD_AXES,
           "A product family in a tag axis: its pair and reduced axis are below k."),
    _const("Tag_GroupBase", "base:number", TAG_GROUP_BASE,
           "Tag axis base: the sums over a class of groups of a collective."),
    _const("Tag_GroupRadix", "k:number", TAG_GROUP_RADIX,
           "A class of groups in a tag axis: its first group, stride and count are below k."),
    _const("Tag_TransBase", "base:number", TAG_TRANS_BASE,
           "Tag axis base: a reduced axis re-indexed by a transpose of its blocks."),
    _const("Tag_TransRadix", "k:number", TAG_TRANS_RADIX,
           "A re-indexed axis in a tag axis: its stride (in blocks) is below k."),
    _const("Tag_TransBlocks", "k:number", TAG_TRANS_BLOCKS,
           "A re-indexed axis in a tag axis: its blocks have fewer than k terms."),
)

RULE_FAMILIES: tuple[RuleFamily, ...] = (
    _family(1, "Key_LayoutPair", "layout.dl", "broadcast_in_dim transpose reshape",
            "the same data movement on both sides"),
    _family(2, "Key_DistSlice", "layout.dl", "slice", "a slice on the distributed side"),
    _family(3, "Key_DistDynSlice", "layout.dl", "dynamic_slice",
            "a dynamic_slice on the distributed side"),
    _family(4, "Key_SeqSlice", "layout.dl", "slice", "a slice on the sequential side"),
    _family(5, "Key_Iota", "layout.dl", "iota", "iota on both sides"),
    _family(6, "Key_Dot", "contraction.dl", "dot_general", "dot_general on both sides"),
    _family(7, "Key_Reduce", "contraction.dl", "reduce_sum reduce_max reduce_min",
            "a reduction on both sides"),
    _family(8, "Key_Gather", "gather.dl", "gather", "gather on both sides"),
    _family(21, "Key_ReshapeGroups", "layout_algebra.dl", "reshape",
            "reshapes paired by the sequential reshape's groups"),
    _family(22, "Key_SeqBroadcastOnes", "layout_algebra.dl", "broadcast_in_dim",
            "a sequential-only broadcast of size-1 dims"),
    _family(23, "Key_Pad", "padding.dl", "pad", "pad on both sides"),
    _family(24, "Key_PadSlice", "padded.dl", "slice dynamic_slice",
            "a slice of a padded block on the distributed side"),
    _family(25, "Key_PadReduce", "padded.dl", "reduce_sum", "a sum over zero-padded blocks"),
    _family(26, "Key_PadDot", "padded.dl", "dot_general", "a dot_general of padded blocks"),
    _family(27, "Key_PadLayout", "padded.dl", "broadcast_in_dim transpose reshape",
            "the same data movement of padded blocks on both sides"),
    _family(28, "Key_PadShift", "halo.dl", "pad",
            "a block of a sequential zero pad's operand, shifted into its result"),
    _family(29, "Key_PadZeros", "halo.dl", "pad collective_permute",
            "a zero block inside a sequential zero pad's padding"),
    _family(30, "Key_PadExtend", "halo.dl", "pad",
            "a distributed zero pad of a block, extended into the sequential padding"),
    _family(31, "Key_CatDynSlice", "concat_windows.dl", "dynamic_slice",
            "a dynamic_slice of a distributed concatenation inside one operand"),
)
CONSTANTS: tuple[Constant, ...] = (UNIT, *REDUCER_CONSTANTS, *TAG_CONSTANTS,
                                   *(f.const for f in RULE_FAMILIES))
assert len({f.key for f in RULE_FAMILIES}) == len(RULE_FAMILIES), "duplicate family key"
assert not {c.name for c in CONSTANTS} & set(BY_NAME), "a constant shadows a relation"


def seed_row(seed_id: int, s: int, d: int, r: int, tag: tuple[int, ...] | None,
             scale: tuple[int, ...]) -> tuple:
    """A `Seed` row: tag (reducer, op, axis, lo, hi), or None for a complete value."""
    red, op, axis, lo, hi = tag if tag is not None else (-1, 0, 0, 0, 0)
    e2, e3, e5, e7 = scale
    return SEED.row(id=seed_id, s=s, d=d, r=r, red=red, op=op, axis=axis, lo=lo, hi=hi,
                    e2=e2, e3=e3, e5=e5, e7=e7)


def seed_fields(row: tuple) -> tuple[int, int, int, int, tuple[int, ...] | None, tuple[int, ...]]:
    """The inverse of seed_row: (id, s, d, r, tag or None, scale)."""
    v = dict(zip((c.name for c in SEED.columns), row))
    tag = None if v["red"] < 0 else (v["red"], v["op"], v["axis"], v["lo"], v["hi"])
    return v["id"], v["s"], v["d"], v["r"], tag, (v["e2"], v["e3"], v["e5"], v["e7"])


def rule_file_of(kind: str) -> str | None:
    """The rule file whose assembler family derives views of `kind`'s outputs."""
    for fam in RULE_FAMILIES:
        if kind in fam.ops:
            return fam.file
    return None


# ---------------------------------------------------------------- bug-pattern queries
# The relations of datalog/patterns.dl, a separate program run after a failing verdict
# (dlverify/patterns/). Declared after RELATIONS on purpose: the verification's rule
# sets neither read nor derive them; they are generated into datalog/pattern_schema.dl.
PATGRAPH_OP = _rel("PatGraph_Op", "Distributed op the pattern queries search (an ancestor of a "
                   "failing output).", "op:OpId")
PATGRAPH_EDGE = _rel("PatGraph_Edge", "The output of distributed op a is an operand of op b.",
                     "a:OpId", "b:OpId")
PATGRAPH_LABEL = _rel("PatGraph_Label", "Op has `label` (a letter of the pattern alphabet: its kind, "
                      "family, class, or its output's view class).", "op:OpId", "label:symbol")
PATTERN_LETTER = _rel("Pattern_Letter", "A letter of some pattern: a conjunction of label tests.",
                      "letter:symbol")
LETTER_HAS = _rel("Letter_Has", "An op reads as `letter` only if it has `label`.",
                  "letter:symbol", "label:symbol")
LETTER_LACKS = _rel("Letter_Lacks", "An op reads as `letter` only if it lacks `label`.",
                    "letter:symbol", "label:symbol")
PATTERN_START = _rel("Pattern_Start", "The minimal DFA of pattern p starts in state q.",
                     "p:symbol", "q:number")
PATTERN_FINAL = _rel("Pattern_Final", "State q of pattern p's DFA accepts.", "p:symbol", "q:number")
PATTERN_MOVE = _rel("Pattern_Move", "Pattern p's DFA moves from q to q2 on `letter`.",
                    "p:symbol", "q:number", "letter:symbol", "q2:number")
PATTERN_FIRST = _rel("Pattern_First", "A match of pattern p can begin at op o, leaving its DFA in q.",
                     "p:symbol", "o:OpId", "q:number", role="output")
PATTERN_STEP = _rel("Pattern_Step", "A step of a match of pattern p: from op o in state q along a "
                    "def-use edge to op o2 in state q2.", "p:symbol", "o:OpId", "q:number",
                    "o2:OpId", "q2:number", role="output")
PATTERN_ACCEPT = _rel("Pattern_Accept", "A match of pattern p ends at op o in accepting state q.",
                      "p:symbol", "o:OpId", "q:number", role="output")
PATTERN_RELATIONS: tuple[Relation, ...] = (
    PATGRAPH_OP, PATGRAPH_EDGE, PATGRAPH_LABEL, PATTERN_LETTER, LETTER_HAS, LETTER_LACKS,
    PATTERN_START, PATTERN_FINAL, PATTERN_MOVE, PATTERN_FIRST, PATTERN_STEP, PATTERN_ACCEPT)
assert not {r.name for r in PATTERN_RELATIONS} & set(BY_NAME), "a pattern relation shadows one"


def _relation_decls(relations: tuple[Relation, ...]) -> list[str]:
    out = []
    for rel in relations:
        cols = ", ".join(f"{c.name}: {c.type}" for c in rel.columns)
        out += [f"/** {rel.doc} */", f".decl {rel.name}({cols})", f".{rel.role} {rel.name}", ""]
    return out


def render_pattern_decls() -> str:
    """The generated `datalog/pattern_schema.dl`."""
    used = {c.type for r in PATTERN_RELATIONS for c in r.columns}
    out = [
        "// GENERATED from dlverify/schema.py by `python -m dlverify.schema` - do not edit.",
        "// Defines: the relations exchanged with Python by the bug-pattern queries",
        "// (datalog/patterns.dl, run by dlverify/patterns/ after a failing verdict).",
        "#pragma once",
        "",
    ]
    for name, body, doc in TYPES:
        if name in used:
            out += [f"/** {doc} */", f".type {name} {body}"]
    return "\n".join(out + [""] + _relation_decls(PATTERN_RELATIONS))


def render_decls() -> str:
    """The generated `datalog/schema.dl`."""
    out = [
        "// GENERATED from dlverify/schema.py by `python -m dlverify.schema` - do not edit.",
        "// Defines: the types, every relation exchanged with Python (.input / .output)",
        "// and the named constants (unit scale, reducer codes, assembler family keys).",
        "#pragma once",
        "",
    ]
    for name, body, doc in TYPES:
        out += [f"/** {doc} */", f".type {name} {body}"]
    out.append("")
    out += _relation_decls(RELATIONS)
    out.append("// Named constants: one fact each (the rule subset has no #define).")
    for const in CONSTANTS:
        out += [f"/** {const.doc} */", f".decl {const.name}({const.column.name}: {const.column.type})",
                f"{const.name}({const.literal()}).", ""]
    return "\n".join(out)


if __name__ == "__main__":
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "datalog"
    for target, text in ((folder / "schema.dl", render_decls()),
                         (folder / "pattern_schema.dl", render_pattern_decls())):
        target.write_text(text)
        print(f"wrote {target}")

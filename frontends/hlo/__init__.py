"""XLA HLO text -> IR, in data-flow order:

* model.py      the parsed module: HloModule -> HloComputation -> HloInstruction,
                HloShape, element types, opcode list, documented size limits;
* text.py       scanning: comments, brackets, strings, a statement cursor;
* parse.py      `parse_hlo_module(text, file)`: text -> HloModule, validated;
* validate.py   every instruction's result shape checked against its operands;
* attributes.py replica groups, shardings, literals, integer lists;
* lower.py      `hlo_to_graph(module, ids, name)`: HloModule -> IR Graph;
* ops/          the opcode handlers of the lowering, one module per family;
* fold.py       static evaluation of small values (loop counters, inits);
* comparator.py what a sort's comparator computation orders by, found by
                evaluating it on probe values;
* pairing.py    `pair_modules`: the Problem of a sequential and a distributed
                module (the one place two HLO modules are paired).
"""
from dlverify.frontends.hlo.attributes import (HloSharding, parse_iota_list, parse_replica_groups,
                                               parse_sharding)
from dlverify.frontends.hlo.lower import HloInfo, HloParam, hlo_to_graph, root_output_relations
from dlverify.frontends.hlo.model import (FLAT_AXIS, MAX_RANKS, HloComputation, HloInstruction,
                                          HloModule, HloShape)
from dlverify.frontends.hlo.parse import parse_hlo_module

__all__ = ["HloShape", "HloInstruction", "HloComputation", "HloModule", "HloSharding", "HloInfo",
           "HloParam", "parse_hlo_module", "hlo_to_graph", "parse_replica_groups",
           "root_output_relations", "parse_sharding", "parse_iota_list", "FLAT_AXIS", "MAX_RANKS"]

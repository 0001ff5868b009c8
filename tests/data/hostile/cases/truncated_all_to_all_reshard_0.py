"""Resharding with all_to_all: from sharded-by-rows to sharded-by-columns.

A tiled all_to_all(split_axis=1, concat_axis=0) turns a block of rows
(S/N, D) into a block of columns (S, D/N): each rank cuts its rows into N
column chunks, sends chunk j to rank j and stacks what it receives in rank
order. This is the DeepSpeed-Ulysses switch from sequence-sharded to
head-sharded activations.

Cases:
- a plain 2-D reshard followed by an elementwise op;
- the Ulysses form: hidde
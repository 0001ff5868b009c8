"""Data parallelism times tensor parallelism on a 2x2 ('dp', 'tp') mesh.

The batch of x is sharded over 'dp'; the MLP y = gelu(x @ w1) @ w2 + b2 is
Megatron-parallel over 'tp' (w1 split on dim 1, w2 on dim 0), so the
partial sums must be reduced over 'tp' only. The output stays sharded on
'dp' and replicated over 'tp'.

Cases: the correct program and a buggy twin that reduces over 'dp'
inst
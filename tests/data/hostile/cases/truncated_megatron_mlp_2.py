"""Megatron-style tensor-parallel MLP: y = gelu(x @ w1) @ w2 + b2.

w1 is split column-wise (on its output dim 1) and w2 row-wise (on its input
dim 0) over the mesh axis 'tp'. Each rank computes gelu on its own block of
hidden units, multiplies by its rows of w2 and obtains a partial sum of y;
one psum over 'tp' completes it, and the replicated bias is added once,
after the psum.

Cases: the correct MLP at TP=2 and TP=4, a variant whose output
nonlinearity follows the second matmul, and three buggy twins (missing
psum, bias ad
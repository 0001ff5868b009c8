"""Ring shift with ppermute: jnp.roll of a row-sharded array by one block.

x (rows, cols) is sharded on its rows over 'ring' (N ranks, BLOCK rows
each). jnp.roll(x, BLOCK, axis
"""Data-parallel gradient of a linear model's mean-squared error.

loss(w) = mean((x @ w - t) ** 2) over the full batch; the batch is sharded
over 'dp' and w is replicated. Each rank differentiates the mean loss of
its own shard; the mean of those local gradients over 'dp' is the full
gradient (all shards have the same size).

Under check_vma=True, autodiff of a replicated (invariant) w inside
shard_map already sums the cotangent over 'dp' (the transpose of the
implicit pvary is a psum). The cases cover both ways of writing it:
making w varying first (pcast) and averaging explicitly, or relying on the
implicit sum and dividing by the dp size.

Buggy
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import dlverify

F32 = jnp.float32


def ident(x):
    return x


def sm(local, n=2, in_specs=(P("x"),), out_specs=P("x")):
    return jax.shard_map(local, mesh=dlverify.host_mesh((n,), ("x",)), in_specs=in_specs,
                         out_specs=out_specs)


def arg(*shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def ok(**kw):
    base = dict(seq=jnp.tanh, dist=sm(jnp.tanh), args=(arg(8, 4),))
    base.update(kw)
    return dlverify.Case(**base)


@dlverify.case
def c():
    return ok(dist=sm(lambda x: x * 2.0), expect='bug')

"""JAX with default preallocation (75% of what cuMemGetInfo reports as total)."""
import json, os, sys, time
import jax, jax.numpy as jnp

marker = sys.argv[1]
x = jnp.ones((1024, 1024))
(x @ x).block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
res = {"mode": "jax", "pid": os.getpid(), "bytes_limit": stats.get("bytes_limit"), "bytes_reserved": stats.get("bytes_reserved")}
print("RESULT " + json.dumps(res), flush=True)
open(marker, "w").write(str(os.getpid()))
time.sleep(4)

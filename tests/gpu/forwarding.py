"""Pure forwarding check: PyTorch, CuPy and JAX compute correctly through the shim.
Prints RESULT {...} with one boolean per framework."""
import json, os, subprocess, sys

res = {}
try:
    import torch
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.float32)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.float32)
    c = (a @ b).cpu()
    ref = a.cpu() @ b.cpu()
    res["torch_matmul"] = bool(torch.allclose(c, ref, rtol=1e-3, atol=1e-2))
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    res["torch_bf16"] = bool(torch.isfinite((x @ x).float()).all().item())
except Exception as e:  # report, do not crash the suite
    res["torch_error"] = repr(e)
try:
    import cupy as cp
    v = cp.arange(1 << 20, dtype=cp.float64)
    res["cupy_sum"] = float(v.sum()) == float((1 << 20) * ((1 << 20) - 1) / 2)
except Exception as e:
    res["cupy_error"] = repr(e)
code = "import jax, jax.numpy as jnp; x = jnp.ones((512,512)); print(float((x @ x)[0,0]), jax.devices()[0].platform)"
try:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    res["jax_dot"] = out.stdout.split()[:2] == ["512.0", "gpu"]
    if not res["jax_dot"]:
        res["jax_output"] = (out.stdout + out.stderr)[-400:]
except Exception as e:
    res["jax_error"] = repr(e)
print("RESULT " + json.dumps(res))

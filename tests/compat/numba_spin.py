"""The spin kernel for the numba-cuda row of the matrix (imported only by that row, so
the other rows never pay numba's import). Same loop as workload.py's PTX kernel; the
name's `_2ms` suffix is the duration the simulated driver gives it."""
from numba import cuda, float32


@cuda.jit
def vgpu_compat_spin_2ms(out, iterations):
    x = float32(cuda.threadIdx.x)
    for _ in range(iterations):
        x = x * float32(0.9999999) + float32(0.001)
    if x > float32(3.0e38):
        out[0] = x

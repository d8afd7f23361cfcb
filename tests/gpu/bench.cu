// Microbenchmarks for the shim's hot paths, driven through whatever libcuda.so.1 the
// loader finds (the real driver bare, the shim under `vgpu run`):
//   launch N [own] : N empty-kernel launches through the runtime (cudart fetches
//               cuLaunchKernel with cuGetProcAddress), microseconds per launch; into the
//               legacy default stream, or with `own` a non-blocking stream of its own;
//   launch-serve N [own] : the same set-up and warm-up, then one round of N launches
//               timed as `launch` times them for each line read from stdin (EOF or a
//               line `quit` ends it), one RESULT line each with the round's ns per
//               launch (limiter/pairs.py); a write that fails (the reader gone) ends it;
//   alloc N   : N cuMemAlloc_v2/cuMemFree_v2 pairs of 1 MiB through the driver API,
//               microseconds per pair.
// Prints one line: RESULT {"what": ..., "per_op_us": ...} (launch-serve: one a round)
#include <cuda.h>
#include <cuda_runtime.h>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

__global__ void empty_kernel() {}

static double now_us() {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// launch-serve's rounds, after launch's warm-up: exits 0 on EOF or `quit`, 3 when a line
// cannot be written.
static int serve(long n, cudaStream_t stream) {
    signal(SIGPIPE, SIG_IGN);
    if (printf("RESULT {\"what\": \"launch-serve\", \"ready\": true, \"n\": %ld}\n", n) < 0 || fflush(stdout)) return 3;
    char line[256];
    for (long served = 0; fgets(line, sizeof line, stdin); served++) {
        if (!strncmp(line, "quit", 4) && (line[4] == '\n' || line[4] == '\0')) break;
        double t0 = now_us();
        for (long i = 0; i < n; i++) empty_kernel<<<1, 1, 0, stream>>>();
        cudaDeviceSynchronize();
        double t1 = now_us();
        if (printf("RESULT {\"what\": \"launch-serve\", \"round\": %ld, \"n\": %ld, \"per_launch_ns\": %.1f}\n",
                   served, n, (t1 - t0) / n * 1e3) < 0 || fflush(stdout)) return 3;
    }
    return 0;
}

int main(int argc, char** argv) {
    if (argc < 3) { fprintf(stderr, "usage: bench launch N [own] | launch-serve N [own] | alloc N\n"); return 2; }
    long n = atol(argv[2]);
    if (cudaFree(0) != cudaSuccess) { fprintf(stderr, "no CUDA\n"); return 1; }
    if (!strcmp(argv[1], "launch") || !strcmp(argv[1], "launch-serve")) {
        cudaStream_t stream = 0;
        if (argc > 3 && !strcmp(argv[3], "own") &&
            cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
            fprintf(stderr, "no stream\n");
            return 1;
        }
        for (int i = 0; i < 1000; i++) empty_kernel<<<1, 1, 0, stream>>>();
        cudaDeviceSynchronize();
        if (!strcmp(argv[1], "launch-serve")) return serve(n, stream);
        double t0 = now_us();
        for (long i = 0; i < n; i++) empty_kernel<<<1, 1, 0, stream>>>();
        cudaDeviceSynchronize();
        double t1 = now_us();
        printf("RESULT {\"what\": \"launch\", \"n\": %ld, \"per_op_us\": %.4f}\n", n, (t1 - t0) / n);
    } else {
        CUdeviceptr p;
        for (int i = 0; i < 1000; i++) { cuMemAlloc(&p, 1 << 20); cuMemFree(p); }
        double t0 = now_us();
        for (long i = 0; i < n; i++) {
            if (cuMemAlloc(&p, 1 << 20) != CUDA_SUCCESS) { fprintf(stderr, "alloc failed\n"); return 1; }
            cuMemFree(p);
        }
        double t1 = now_us();
        printf("RESULT {\"what\": \"alloc\", \"n\": %ld, \"per_op_us\": %.4f}\n", n, (t1 - t0) / n);
    }
    return 0;
}

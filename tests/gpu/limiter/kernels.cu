// Workloads for the compute limiter test on a real GPU (tests/gpu/limiter/run_limiter.sh).
//
//   kernels spin US SECONDS   launch clock64 spin kernels of ~US microseconds back to back
//                             for SECONDS; print one JSON line with the achieved busy
//                             fraction (launches x measured kernel time / wall) and the
//                             busy fraction of every 100 ms window
//   kernels empty SECONDS     launch empty kernels as fast as possible; print launches/s
//
// Build: nvcc -O2 -arch=sm_90 -o kernels kernels.cu -lcuda
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <vector>

__global__ void spin(long long cycles, int *sink) {
    long long start = clock64();
    while (clock64() - start < cycles) {
    }
    if (threadIdx.x == 0 && sink) *sink = (int)(clock64() & 1);
}

__global__ void empty() {}

static double now_s() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t err_ = (call);                                                    \
        if (err_ != cudaSuccess) {                                                    \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(err_));             \
            return 2;                                                                 \
        }                                                                             \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: kernels spin US SECONDS | kernels empty SECONDS\n");
        return 1;
    }
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (strcmp(argv[1], "empty") == 0) {
        double seconds = atof(argv[2]);
        empty<<<1, 32, 0, stream>>>();
        CHECK(cudaStreamSynchronize(stream));
        long long launches = 0;
        double t0 = now_s();
        while (now_s() - t0 < seconds) {
            for (int i = 0; i < 256; i++) empty<<<1, 32, 0, stream>>>();
            launches += 256;
            CHECK(cudaStreamSynchronize(stream));
        }
        double wall = now_s() - t0;
        printf("{\"mode\":\"empty\",\"launches\":%lld,\"wall_s\":%.3f,\"launches_per_s\":%.0f}\n", launches, wall, launches / wall);
        return 0;
    }
    if (argc < 4) return 1;
    double want_us = atof(argv[2]), seconds = atof(argv[3]);
    int clock_khz = 0;
    CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    int *sink;
    CHECK(cudaMalloc(&sink, sizeof(int)));
    long long cycles = (long long)(want_us * clock_khz / 1000.0);
    // Measure what one kernel really takes (events bracket it on our own stream).
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    float kernel_ms = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(cudaEventRecord(a, stream));
        spin<<<1, 32, 0, stream>>>(cycles, sink);
        CHECK(cudaEventRecord(b, stream));
        CHECK(cudaEventSynchronize(b));
        CHECK(cudaEventElapsedTime(&kernel_ms, a, b));
    }
    // Keep at most a few kernels queued, as a program that consumes results would.
    const int depth = 4;
    std::vector<cudaEvent_t> ring(depth);
    for (auto &e : ring) CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    std::vector<long long> per_window((size_t)(seconds * 10) + 2, 0);
    long long launches = 0;
    double t0 = now_s();
    for (;;) {
        double t = now_s() - t0;
        if (t >= seconds) break;
        cudaEvent_t slot = ring[launches % depth];
        if (launches >= depth) CHECK(cudaEventSynchronize(slot));
        spin<<<1, 32, 0, stream>>>(cycles, sink);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(slot, stream));
        size_t w = (size_t)((now_s() - t0) * 10);
        if (w < per_window.size()) per_window[w]++;
        launches++;
    }
    CHECK(cudaStreamSynchronize(stream));
    double wall = now_s() - t0;
    // Under a compute limit the calibration launches above are themselves throttled, and
    // the wait lands between their events: count busy time from the spin's nominal
    // length (cycles / SM clock), which is what clock64 spins for.
    double nominal_ms = cycles / (double)clock_khz;
    if (kernel_ms > nominal_ms * 1.15) kernel_ms = nominal_ms;
    double busy = launches * kernel_ms / 1000.0 / wall * 100.0;
    printf("{\"mode\":\"spin\",\"kernel_ms\":%.4f,\"launches\":%lld,\"wall_s\":%.3f,\"busy_pct\":%.2f,\"t0\":%.6f,\"windows\":[", kernel_ms, launches, wall, busy, t0);
    size_t windows = (size_t)(seconds * 10);
    for (size_t w = 0; w < windows; w++) printf("%s%.1f", w ? "," : "", per_window[w] * kernel_ms / 100.0 * 100.0);
    printf("]}\n");
    return 0;
}

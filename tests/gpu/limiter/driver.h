// The CUDA driver API as the limiter's C diagnostics (costs.c, idle_sample.c) call it:
// loaded with dlopen from whatever libcuda.so.1 the loader finds, so the same program
// runs on the bare driver and through the shim. `load_driver()` fills the pointers
// below (1 and a line on stderr where one is missing), `create_context()` makes device
// 0's context current; `CHECK` ends the program on an error, naming the call.
#ifndef VGPU_LIMITER_DRIVER_H
#define VGPU_LIMITER_DRIVER_H
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef void *H;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuCtxCreate)(H *, unsigned, int);
static CUresult (*cuCtxGetCurrent)(H *);
static CUresult (*cuStreamCreate)(H *, unsigned);
static CUresult (*cuStreamIsCapturing)(H, int *);
static CUresult (*cuStreamSynchronize)(H);
static CUresult (*cuEventCreate)(H *, unsigned);
static CUresult (*cuEventRecord)(H, H);
static CUresult (*cuEventQuery)(H);
static CUresult (*cuEventElapsedTime)(float *, H, H);
static CUresult (*cuThreadExchangeStreamCaptureMode)(unsigned *);
static CUresult (*cuModuleLoadData)(H *, const void *);
static CUresult (*cuModuleGetFunction)(H *, H, const char *);
static CUresult (*cuLaunchKernel)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, H, void **, void **);

#define CHECK(call)                                                       \
    do {                                                                  \
        CUresult r_ = (call);                                             \
        if (r_) { fprintf(stderr, "%s: %d\n", #call, r_); exit(1); }      \
    } while (0)

// Fills the pointers above from libcuda.so.1 (a name or its _v2); 1 on a failure.
static int load_driver(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) { fprintf(stderr, "%s\n", dlerror()); return 1; }
#define LOAD(name)                                                        \
    do {                                                                  \
        *(void **)&name = dlsym(cuda, #name);                             \
        if (!name) *(void **)&name = dlsym(cuda, #name "_v2");            \
        if (!name) { fprintf(stderr, "no %s\n", #name); return 1; }       \
    } while (0)
    LOAD(cuInit); LOAD(cuDeviceGet); LOAD(cuCtxCreate); LOAD(cuCtxGetCurrent);
    LOAD(cuStreamCreate); LOAD(cuStreamIsCapturing); LOAD(cuStreamSynchronize);
    LOAD(cuEventCreate); LOAD(cuEventRecord); LOAD(cuEventQuery); LOAD(cuEventElapsedTime);
    LOAD(cuThreadExchangeStreamCaptureMode);
    LOAD(cuModuleLoadData); LOAD(cuModuleGetFunction); LOAD(cuLaunchKernel);
#undef LOAD
    return 0;
}

// Initialises the driver and makes a context of device 0 current: the context.
static H create_context(void) {
    int device;
    H context;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuCtxCreate(&context, 0, device));
    return context;
}

// Monotonic nanoseconds.
static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
#endif

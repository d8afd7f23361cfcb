// Launch cost on the CPU: N launches of a 100 ns simulated kernel on one stream through
// whatever libcuda.so.1 the loader finds (the sim bare, or the shim over the sim under
// vgpu run, with or without --cores). The kernel is shorter than a launch, so a limit
// of 99 never binds: what is left is what the limiter adds to each launch.
// `launch_cost N KERNEL` launches KERNEL instead (a sim name such as k_2us): a kernel
// longer than a launch keeps the simulated GPU behind the host, as a real one is behind
// a fast enough host, so that unsettled samples pile up and their settling shows.
// Build: cc -O2 -o launch_cost launch_cost.c -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int (*init_t)(unsigned);
typedef int (*device_get_t)(int *, int);
typedef int (*retain_t)(void **, int);
typedef int (*set_current_t)(void *);
typedef int (*load_data_t)(void **, const void *);
typedef int (*get_function_t)(void **, void *, const char *);
typedef int (*stream_create_t)(void **, unsigned);
typedef int (*stream_sync_t)(void *);
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);

static const char PTX_FORMAT[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry %s()\n{\n ret;\n}\n";

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    const char *kernel = argc > 2 ? argv[2] : "k_100ns";
    char ptx[256];
    if (snprintf(ptx, sizeof ptx, PTX_FORMAT, kernel) >= (int)sizeof ptx) {
        puts("kernel name too long");
        return 1;
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        puts(dlerror());
        return 1;
    }
    init_t init = (init_t)dlsym(lib, "cuInit");
    device_get_t device_get = (device_get_t)dlsym(lib, "cuDeviceGet");
    retain_t retain = (retain_t)dlsym(lib, "cuDevicePrimaryCtxRetain");
    set_current_t set_current = (set_current_t)dlsym(lib, "cuCtxSetCurrent");
    load_data_t load_data = (load_data_t)dlsym(lib, "cuModuleLoadData");
    get_function_t get_function = (get_function_t)dlsym(lib, "cuModuleGetFunction");
    stream_create_t stream_create = (stream_create_t)dlsym(lib, "cuStreamCreate");
    stream_sync_t stream_sync = (stream_sync_t)dlsym(lib, "cuStreamSynchronize");
    launch_t launch = (launch_t)dlsym(lib, "cuLaunchKernel");
    int device;
    void *context, *module, *function, *stream;
    if (init(0) || device_get(&device, 0) || retain(&context, device) || set_current(context) ||
        load_data(&module, ptx) || get_function(&function, module, kernel) ||
        stream_create(&stream, 1)) {
        puts("setup failed");
        return 1;
    }
    // LAUNCH_STREAM=legacy: the legacy default stream (what cudart's <<<>>> uses).
    const char *which = getenv("LAUNCH_STREAM");
    if (which && !strcmp(which, "legacy")) stream = 0;
    for (int i = 0; i < 10000; i++) launch(function, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0);
    stream_sync(stream);
    double t0 = now_ns();
    for (long i = 0; i < n; i++) {
        if (launch(function, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0)) {
            puts("launch failed");
            return 1;
        }
    }
    double t1 = now_ns();
    stream_sync(stream);
    printf("%.1f ns per launch\n", (t1 - t0) / n);
    return 0;
}

// Kernels of the GPU suite's `reserve` section (issue 24): each makes the driver use a
// reservation of its own. Built with `nvcc -arch=sm_90 -cubin`; loaded by
// tests/clients/reserve_check.py, launched with one thread and one 64-bit argument.
#include <cstdio>

// The device malloc heap (cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)).
extern "C" __global__ void use_heap(unsigned long long bytes) {
    char *p = static_cast<char *>(malloc(bytes));
    if (p != nullptr) {
        p[0] = 1;
        free(p);
    }
}

// The printf FIFO (CU_LIMIT_PRINTF_FIFO_SIZE).
extern "C" __global__ void use_printf(unsigned long long value) {
    printf("reserve %llu\n", value);
}

// 16 KiB of local memory per thread: past the default 1 KiB stack, so the driver grows
// the local memory it backs for every resident thread (CU_LIMIT_STACK_SIZE).
extern "C" __global__ void use_stack(unsigned long long value) {
    volatile char frame[16384];
    for (int i = 0; i < 16384; i += 64) frame[i] = static_cast<char>(value + i);
    if (frame[value % 16384] == 7) printf("%d\n", frame[(value * 3) % 16384]);
}

extern "C" __global__ void touch(unsigned long long) {}

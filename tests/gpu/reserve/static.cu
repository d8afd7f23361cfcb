// A module of the GPU suite's `reserve` section (issue 24) whose static `__device__`
// data is STATIC_MIB MiB (default 1536): the driver allocates it for the module, at no
// allocation call. Built with `nvcc -arch=sm_90 -DSTATIC_MIB=N -ptx|-cubin|-fatbin`.
#ifndef STATIC_MIB
#define STATIC_MIB 1536
#endif

__device__ char data[static_cast<unsigned long long>(STATIC_MIB) << 20];

extern "C" __global__ void touch() { data[threadIdx.x] = 1; }

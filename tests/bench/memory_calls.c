// Hook cost of the memory calls issue 13 changed, on the CPU: N calls each of
// cuMemAllocAsync+cuMemFreeAsync pairs of 1 MiB from the default pool (stream 0),
// cuMemGetInfo_v2, and cuStreamSynchronize, through whatever libcuda.so.1 the loader
// finds (the sim bare, or the shim over the sim under vgpu run).
// Build: cc -O2 -o memory_calls memory_calls.c -ldl      Run: memory_calls N
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int (*init_t)(unsigned); typedef int (*dev_t_)(int*, int); typedef int (*retain_t)(void**, int);
typedef int (*setc_t)(void*); typedef int (*aalloc_t)(unsigned long long*, size_t, void*);
typedef int (*afree_t)(unsigned long long, void*); typedef int (*info_t)(size_t*, size_t*); typedef int (*sync_t)(void*);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int argc,char**argv){
  long n=argc>1?atol(argv[1]):100000; void*h=dlopen("libcuda.so.1",RTLD_NOW); if(!h){puts(dlerror());return 1;}
  init_t i=(init_t)dlsym(h,"cuInit"); dev_t_ g=(dev_t_)dlsym(h,"cuDeviceGet"); retain_t r=(retain_t)dlsym(h,"cuDevicePrimaryCtxRetain");
  setc_t s=(setc_t)dlsym(h,"cuCtxSetCurrent"); aalloc_t a=(aalloc_t)dlsym(h,"cuMemAllocAsync"); afree_t f=(afree_t)dlsym(h,"cuMemFreeAsync");
  info_t mi=(info_t)dlsym(h,"cuMemGetInfo_v2"); sync_t sy=(sync_t)dlsym(h,"cuStreamSynchronize");
  int d; void*c; if(i(0)||g(&d,0)||r(&c,d)||s(c)) {puts("init failed");return 1;}
  unsigned long long p; size_t fr,to;
  for(int k=0;k<1000;k++){a(&p,1<<20,0);f(p,0);}
  double t0=now(); for(long k=0;k<n;k++){ if(a(&p,1<<20,0)){puts("alloc failed");return 1;} f(p,0);} double t1=now();
  for(long k=0;k<n;k++) mi(&fr,&to); double t2=now();
  for(long k=0;k<n;k++) sy(0); double t3=now();
  printf("async_pair_ns %.1f get_info_ns %.1f stream_sync_ns %.1f\n",(t1-t0)/n,(t2-t1)/n,(t3-t2)/n); return 0; }

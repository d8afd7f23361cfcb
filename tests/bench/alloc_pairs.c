// Hook overhead on the CPU: N cuMemAlloc_v2/cuMemFree_v2 pairs of 1 MiB through whatever
// libcuda.so.1 the loader finds (the sim bare, or the shim over the sim under vgpu run).
// Build: cc -O2 -o alloc_pairs alloc_pairs.c -ldl
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef int (*init_t)(unsigned); typedef int (*dev_t_)(int*, int); typedef int (*retain_t)(void**, int);
typedef int (*setc_t)(void*); typedef int (*alloc_t)(unsigned long long*, size_t); typedef int (*free_t)(unsigned long long);
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e9+t.tv_nsec;}
int main(int argc,char**argv){
  long n=atol(argv[1]); void*h=dlopen("libcuda.so.1",RTLD_NOW); if(!h){puts(dlerror());return 1;}
  init_t i=(init_t)dlsym(h,"cuInit"); dev_t_ g=(dev_t_)dlsym(h,"cuDeviceGet"); retain_t r=(retain_t)dlsym(h,"cuDevicePrimaryCtxRetain");
  setc_t s=(setc_t)dlsym(h,"cuCtxSetCurrent"); alloc_t a=(alloc_t)dlsym(h,"cuMemAlloc_v2"); free_t f=(free_t)dlsym(h,"cuMemFree_v2");
  int d; void*c; if(i(0)||g(&d,0)||r(&c,d)||s(c)) {puts("init failed");return 1;}
  unsigned long long p; for(int k=0;k<1000;k++){a(&p,1<<20);f(p);}
  double t0=now(); for(long k=0;k<n;k++){ if(a(&p,1<<20)){puts("alloc failed");return 1;} f(p);} double t1=now();
  printf("%.1f ns per alloc+free pair\n",(t1-t0)/n); return 0; }

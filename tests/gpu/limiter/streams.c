// The compute limiter's workloads on a real GPU (and, for dry runs, on the simulated
// driver): driver API only, through whatever libcuda.so.1 the loader finds, with PTX
// kernels the driver compiles itself. A kernel spins on %globaltimer for the time its
// parameter says; its name ends in the same duration, which is what the simulated
// driver reads. Each block asks for more than half of an SM's shared memory, so it has
// an SM to itself: a "quarter-card" kernel of SMs/4 blocks takes a quarter of the card,
// four of them fill it, and a fifth waits for SMs.
//
//   streams sweep SECONDS          bare baselines: every case below, one JSON line each
//   streams run CASE SECONDS [windows]
//                                  one case, one JSON line: completed kernels (or graphs)
//                                  per second, and with `windows` each 100 ms window's
//   streams launch N               N launches of an empty kernel on one stream: ns each
//   streams launch-serve N         the same set-up, then one round of N launches for each
//                                  line read from stdin, one JSON line each (pairs.py)
//   streams launch-ab N            in one process, the shim's cuLaunchKernel against the real
//                                  driver's own (found among the loaded objects), in
//                                  alternating blocks of N/40 launches: what the shim adds
//
// CASE: q<S>x<K>  S streams (one thread each) of quarter-card kernels of K (100us, 1ms)
//       f<K>      one stream of full-card kernels of K (100us, 1ms, 10ms)
//       w1ms      one stream of full-card fixed-work kernels (WORK_ITERS dependent steps a
//                 thread, about 1 ms bare on an H200): unlike a spin kernel, one that is
//                 time-sliced out takes longer, so its throughput is the SM time it got
//       g<K>      one stream of graphs of 8 full-card kernels of K, captured once
//       h1ms      a hostile tenant (issue 25): a full-card spin kernel taught at 100 us
//                 from HOSTILE_TEACHING launches queued back to back, then launched with
//                 HOSTILE_TIMES that work (1 ms: a loop count in its first parameter, the
//                 function and grid the same, `spin_scaled_100us`; the simulated driver
//                 reads the same parameter) into its idle stream, each
//                 waited for, so that every sample of it beside a busy neighbour starts
//                 idle (and may time the neighbour's slice: the limiter sets such samples
//                 aside, charging no more than the 100 us it was taught)
// Every thread keeps at most DEPTH kernels queued on its stream, as a program that
// reads its results would; a kernel counts when its "done" event is waited on.
//
// Build: cc -O2 -o streams streams.c -ldl -lpthread
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEPTH 8
#define MAX_STREAMS 8
#define MAX_WINDOWS 600
#define GRAPH_NODES 8
#define HOSTILE_TEACHING 200
#define HOSTILE_TIMES 10

typedef int CUresult;
typedef void *H;

static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGet)(int *, int);
static CUresult (*cuDeviceGetAttribute)(int *, int, int);
static CUresult (*cuDevicePrimaryCtxRetain)(H *, int);
static CUresult (*cuCtxSetCurrent)(H);
static CUresult (*cuModuleLoadData)(H *, const void *);
static CUresult (*cuModuleGetFunction)(H *, H, const char *);
static CUresult (*cuFuncSetAttribute)(H, int, int);
static CUresult (*cuStreamCreate)(H *, unsigned);
static CUresult (*cuStreamSynchronize)(H);
static CUresult (*cuEventCreate)(H *, unsigned);
static CUresult (*cuEventRecord)(H, H);
static CUresult (*cuEventSynchronize)(H);
static CUresult (*cuLaunchKernel)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, H, void **, void **);
static CUresult (*cuStreamBeginCapture_v2)(H, unsigned);
static CUresult (*cuStreamEndCapture)(H, H *);
static CUresult (*cuGraphInstantiateWithFlags)(H *, H, unsigned long long);
static CUresult (*cuGraphLaunch)(H, H);

#define SPIN(name)                                                                            \
    ".visible .entry " name "(.param .u64 ns)\n"                                              \
    "{\n .reg .u64 %t0, %t1, %d, %n;\n .reg .pred %p;\n ld.param.u64 %n, [ns];\n"             \
    " mov.u64 %t0, %globaltimer;\nLOOP:\n mov.u64 %t1, %globaltimer;\n"                       \
    " sub.u64 %d, %t1, %t0;\n setp.lt.u64 %p, %d, %n;\n @%p bra LOOP;\n ret;\n}\n"
/* A spin of `times` x `ns` (`times` first: the simulated driver runs a `_scaled_` kernel's
 * named duration its first parameter's times). */
#define SPIN_SCALED(name)                                                                     \
    ".visible .entry " name "(.param .u32 times, .param .u64 ns)\n"                          \
    "{\n .reg .u64 %t0, %t1, %d, %n, %k;\n .reg .u32 %m;\n .reg .pred %p;\n"                  \
    " ld.param.u32 %m, [times];\n ld.param.u64 %n, [ns];\n cvt.u64.u32 %k, %m;\n"             \
    " mul.lo.u64 %n, %n, %k;\n mov.u64 %t0, %globaltimer;\nLOOP:\n mov.u64 %t1, %globaltimer;\n" \
    " sub.u64 %d, %t1, %t0;\n setp.lt.u64 %p, %d, %n;\n @%p bra LOOP;\n ret;\n}\n"
/* Fixed work: `n` dependent multiply-adds a thread; the result is stored only when `n` is
 * all ones (never), so the loop cannot be compiled away. */
#define WORK(name)                                                                            \
    ".visible .entry " name "(.param .u64 n, .param .u64 out)\n"                              \
    "{\n .reg .u64 %i, %n, %o;\n .reg .u32 %a;\n .reg .pred %p;\n ld.param.u64 %n, [n];\n"     \
    " mov.u64 %i, 0;\n mov.u32 %a, %tid.x;\nLOOP:\n mad.lo.u32 %a, %a, 1664525, 1013904223;\n"  \
    " add.u64 %i, %i, 1;\n setp.lt.u64 %p, %i, %n;\n @%p bra LOOP;\n"                          \
    " setp.ne.u64 %p, %n, -1;\n @%p bra DONE;\n ld.param.u64 %o, [out];\n"                     \
    " st.global.u32 [%o], %a;\nDONE:\n ret;\n}\n"
/* Steps of a fixed-work kernel: about 1 ms on an H200 (the suite compares each case with
 * the same kernel bare in the same call, so only the order of magnitude matters). */
#define WORK_ITERS 250000ULL
static const char PTX[] = ".version 7.8\n.target sm_80\n.address_size 64\n" SPIN("spin_100us")
    SPIN("spin_1ms") SPIN("spin_10ms") SPIN("empty_100ns") SPIN("empty1_100ns")
    SPIN("empty2_100ns") SPIN("empty3_100ns") SPIN("empty4_100ns") SPIN("empty5_100ns")
    SPIN("empty6_100ns") SPIN("empty7_100ns") WORK("work_1ms")
    SPIN_SCALED("spin_scaled_100us");

static H context;
static int sms = 132;
static int shared_bytes;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHECK(call)                                                                           \
    do {                                                                                      \
        CUresult rc_ = (call);                                                                \
        if (rc_ != 0) {                                                                       \
            fprintf(stderr, "%s: error %d\n", #call, rc_);                                    \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

static void *need(void *lib, const char *name) {
    void *symbol = dlsym(lib, name);
    if (!symbol) {
        fprintf(stderr, "no %s\n", name);
        exit(2);
    }
    return symbol;
}

static H module;

static void start(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        exit(2);
    }
    *(void **)&cuInit = need(lib, "cuInit");
    *(void **)&cuDeviceGet = need(lib, "cuDeviceGet");
    *(void **)&cuDeviceGetAttribute = need(lib, "cuDeviceGetAttribute");
    *(void **)&cuDevicePrimaryCtxRetain = need(lib, "cuDevicePrimaryCtxRetain");
    *(void **)&cuCtxSetCurrent = need(lib, "cuCtxSetCurrent");
    *(void **)&cuModuleLoadData = need(lib, "cuModuleLoadData");
    *(void **)&cuModuleGetFunction = need(lib, "cuModuleGetFunction");
    *(void **)&cuFuncSetAttribute = need(lib, "cuFuncSetAttribute");
    *(void **)&cuStreamCreate = need(lib, "cuStreamCreate");
    *(void **)&cuStreamSynchronize = need(lib, "cuStreamSynchronize");
    *(void **)&cuEventCreate = need(lib, "cuEventCreate");
    *(void **)&cuEventRecord = need(lib, "cuEventRecord");
    *(void **)&cuEventSynchronize = need(lib, "cuEventSynchronize");
    *(void **)&cuLaunchKernel = need(lib, "cuLaunchKernel");
    *(void **)&cuStreamBeginCapture_v2 = need(lib, "cuStreamBeginCapture_v2");
    *(void **)&cuStreamEndCapture = need(lib, "cuStreamEndCapture");
    *(void **)&cuGraphInstantiateWithFlags = need(lib, "cuGraphInstantiateWithFlags");
    *(void **)&cuGraphLaunch = need(lib, "cuGraphLaunch");
    int device, per_sm = 0, optin = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&device, 0));
    CHECK(cuDeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, device));
    CHECK(cuDeviceGetAttribute(&per_sm, 81 /* MAX_SHARED_MEMORY_PER_MULTIPROCESSOR */, device));
    CHECK(cuDeviceGetAttribute(&optin, 97 /* MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */, device));
    shared_bytes = per_sm / 2 + 1024;
    if (shared_bytes > optin) shared_bytes = optin;
    CHECK(cuDevicePrimaryCtxRetain(&context, device));
    CHECK(cuCtxSetCurrent(context));
    CHECK(cuModuleLoadData(&module, PTX));
}

struct kernel {
    H function;
    unsigned long long ns;
    unsigned blocks;
    int fixed_work;
    /* A `spin_scaled_` kernel's first parameter (its work `times` its ns); 0 otherwise. */
    unsigned times;
};

static struct kernel kernel_of(const char *duration, unsigned blocks, int fixed_work) {
    struct kernel k;
    char name[64];
    snprintf(name, sizeof name, "%s_%s", fixed_work ? "work" : "spin", duration);
    k.fixed_work = fixed_work;
    k.times = 0;
    CHECK(cuModuleGetFunction(&k.function, module, name));
    CHECK(cuFuncSetAttribute(k.function, 8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */, shared_bytes));
    k.ns = !strcmp(duration, "100us") ? 100000ULL : !strcmp(duration, "1ms") ? 1000000ULL : 10000000ULL;
    k.blocks = blocks;
    return k;
}

static CUresult launch(const struct kernel *k, H stream) {
    unsigned long long ns = k->fixed_work ? WORK_ITERS : k->ns, out = 0;
    unsigned times = k->times;
    void *params[] = {&ns, &out};
    void *scaled[] = {&times, &ns};
    return cuLaunchKernel(k->function, k->blocks, 1, 1, 128, 1, 1, shared_bytes, stream,
                          k->times ? scaled : params, NULL);
}

/* The hostile tenant's kernel (h1ms): `spin_scaled_100us` at its taught work. */
static struct kernel scaled_kernel(unsigned blocks) {
    struct kernel k = {0};
    CHECK(cuModuleGetFunction(&k.function, module, "spin_scaled_100us"));
    CHECK(cuFuncSetAttribute(k.function, 8 /* MAX_DYNAMIC_SHARED_SIZE_BYTES */, shared_bytes));
    k.ns = 100000ULL;
    k.blocks = blocks;
    k.times = 1;
    return k;
}

struct lane {
    struct kernel kernel;
    int one_at_a_time; /* each launch waited for before the next (h1ms) */
    H graph; /* an executable graph, or NULL for kernels */
    H stream;
    H ring[DEPTH];
    double t0, warm, end;
    long completed;
    long windows[MAX_WINDOWS];
};

static void count(struct lane *lane, double t) {
    if (t >= lane->warm && t < lane->end) lane->completed++;
    long w = (long)((t - lane->t0) * 10);
    if (w >= 0 && w < MAX_WINDOWS) lane->windows[w]++;
}

static void *drive(void *arg) {
    struct lane *lane = arg;
    CHECK(cuCtxSetCurrent(context));
    long launched = 0;
    while (lane->one_at_a_time && now_s() < lane->end) {
        CHECK(launch(&lane->kernel, lane->stream));
        CHECK(cuStreamSynchronize(lane->stream));
        count(lane, now_s());
    }
    while (now_s() < lane->end) {
        int slot = launched % DEPTH;
        if (launched >= DEPTH) {
            CHECK(cuEventSynchronize(lane->ring[slot]));
            count(lane, now_s());
        }
        CHECK(lane->graph ? cuGraphLaunch(lane->graph, lane->stream) : launch(&lane->kernel, lane->stream));
        CHECK(cuEventRecord(lane->ring[slot], lane->stream));
        launched++;
    }
    for (long done = launched > DEPTH ? launched - DEPTH : 0; done < launched; done++) {
        CHECK(cuEventSynchronize(lane->ring[done % DEPTH]));
        count(lane, now_s());
    }
    return NULL;
}

static H stream_new(void) {
    H stream;
    CHECK(cuStreamCreate(&stream, 1 /* NON_BLOCKING */));
    return stream;
}

/* Runs one case for `seconds` (after a 0.3 s warm-up); prints its JSON line. */
static void run_case(const char *name, double seconds, int windows) {
    int streams = 1, quarter = 0, graph = 0, fixed_work = 0, hostile = 0;
    char duration[16] = "";
    if (name[0] == 'q' && sscanf(name, "q%dx%15s", &streams, duration) == 2) {
        quarter = 1;
    } else if (!strcmp(name, "h1ms")) {
        hostile = 1;
        snprintf(duration, sizeof duration, "100us");
    } else if (!strcmp(name, "w1ms")) {
        fixed_work = 1;
        snprintf(duration, sizeof duration, "1ms");
    } else if (name[0] == 'f' || name[0] == 'g') {
        graph = name[0] == 'g';
        snprintf(duration, sizeof duration, "%s", name + 1);
    } else {
        fprintf(stderr, "bad case %s\n", name);
        exit(1);
    }
    if (streams < 1 || streams > MAX_STREAMS) exit(1);
    unsigned blocks = quarter ? (unsigned)(sms / 4) : (unsigned)sms;
    static struct lane lanes[MAX_STREAMS];
    pthread_t threads[MAX_STREAMS];
    double t0 = now_s();
    for (int i = 0; i < streams; i++) {
        struct lane *lane = &lanes[i];
        memset(lane, 0, sizeof *lane);
        lane->kernel = hostile ? scaled_kernel(blocks) : kernel_of(duration, blocks, fixed_work);
        lane->stream = stream_new();
        if (hostile) {
            for (int n = 0; n < HOSTILE_TEACHING; n++) CHECK(launch(&lane->kernel, lane->stream));
            CHECK(cuStreamSynchronize(lane->stream));
            lane->kernel.times = HOSTILE_TIMES;
            lane->one_at_a_time = 1;
        }
        for (int j = 0; j < DEPTH; j++) CHECK(cuEventCreate(&lane->ring[j], 2 /* DISABLE_TIMING */));
        if (graph) {
            H g;
            CHECK(cuStreamBeginCapture_v2(lane->stream, 2 /* RELAXED */));
            for (int n = 0; n < GRAPH_NODES; n++) CHECK(launch(&lane->kernel, lane->stream));
            CHECK(cuStreamEndCapture(lane->stream, &g));
            CHECK(cuGraphInstantiateWithFlags(&lane->graph, g, 0));
        }
    }
    t0 = now_s();
    for (int i = 0; i < streams; i++) {
        lanes[i].t0 = t0;
        lanes[i].warm = t0 + 0.3;
        lanes[i].end = t0 + 0.3 + seconds;
        pthread_create(&threads[i], NULL, drive, &lanes[i]);
    }
    long completed = 0;
    for (int i = 0; i < streams; i++) {
        pthread_join(threads[i], NULL);
        completed += lanes[i].completed;
    }
    /* Work per completion, as a share of the card's time: what fits at once. */
    double work_s = lanes[0].kernel.ns * 1e-9 * (graph ? GRAPH_NODES : hostile ? HOSTILE_TIMES : 1);
    int fit = quarter ? (streams < 4 ? streams : 4) : 1;
    printf("{\"case\": \"%s\", \"per_s\": %.3f, \"completed\": %ld, \"seconds\": %.3f, "
           "\"work_s\": %.6f, \"fit\": %d, \"t0\": %.6f",
           name, completed / seconds, completed, seconds, work_s, fit, t0);
    if (windows) {
        long n = (long)((0.3 + seconds) * 10);
        if (n > MAX_WINDOWS) n = MAX_WINDOWS;
        printf(", \"windows\": [");
        for (long w = 0; w < n; w++) {
            long sum = 0;
            for (int i = 0; i < streams; i++) sum += lanes[i].windows[w];
            printf("%s%.1f", w ? ", " : "", sum * work_s / 0.1 / fit * 100.0);
        }
        printf("]");
    }
    printf("}\n");
    fflush(stdout);
}

/* The real driver beside the shim: a loaded object named libcuda.so* that is not the one
 * `dlopen("libcuda.so.1")` gave (the shim loads the real driver by its full path). */
struct other_libcuda {
    char shim[PATH_MAX];
    char found[PATH_MAX];
};

static int find_other_libcuda(struct dl_phdr_info *info, size_t size, void *arg) {
    (void)size;
    struct other_libcuda *search = arg;
    const char *name = info->dlpi_name, *base = strrchr(name, '/');
    char resolved[PATH_MAX];
    base = base ? base + 1 : name;
    if (strncmp(base, "libcuda.so", 10) != 0 || !realpath(name, resolved)) return 0;
    if (strcmp(resolved, search->shim) == 0) return 0;
    snprintf(search->found, sizeof search->found, "%s", resolved);
    return 1;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int n) {
    qsort(values, n, sizeof *values, compare_doubles);
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

#define AB_BLOCKS 40
#define AB_BURST 64

/* Host time of `launches` launches of `function` through `launch_fn`, in bursts of
 * AB_BURST with a synchronisation between them that is not timed: the queue never
 * fills, so the time is the calls' own, not the GPU's pace. Seconds. */
#define AB_MAX_KERNELS 8
static H ab_functions[AB_MAX_KERNELS];
static int ab_kernels = 1;

static double timed_launches(CUresult (*launch_fn)(H, unsigned, unsigned, unsigned, unsigned,
                                                   unsigned, unsigned, unsigned, H, void **, void **),
                             H function, H stream, long launches) {
    unsigned long long ns = 0;
    void *params[] = {&ns};
    double spent = 0;
    for (long done = 0; done < launches; done += AB_BURST) {
        double t0 = now_s();
        for (int i = 0; i < AB_BURST; i++)
            CHECK(launch_fn(ab_kernels > 1 ? ab_functions[i % ab_kernels] : function, 1, 1, 1, 32,
                            1, 1, 0, stream, params, NULL));
        spent += now_s() - t0;
        CHECK(cuStreamSynchronize(stream));
    }
    return spent;
}

/* The shim's cost on the launch path, measured in one process: blocks of launches through
 * the shim and straight into the real driver alternate (ABBA), on the same thread, CPU,
 * context and stream, so what differs is the shim alone (a launch it does not see is
 * neither limited nor charged: empty kernels, for a cost). Prints medians of both and the
 * median of the blocks' pairwise ratios. */
static int launch_ab(long n) {
    struct other_libcuda search = {0};
    Dl_info info;
    if (!dladdr((void *)cuLaunchKernel, &info) || !realpath(info.dli_fname, search.shim)) {
        fprintf(stderr, "launch-ab: cannot tell where cuLaunchKernel came from\n");
        return 2;
    }
    dl_iterate_phdr(find_other_libcuda, &search);
    if (!search.found[0]) {
        printf("{\"case\": \"launch-ab\", \"error\": \"no second libcuda loaded (no shim?)\", "
               "\"shim\": \"%s\"}\n", search.shim);
        return 0;
    }
    void *real_lib = dlopen(search.found, RTLD_NOW | RTLD_NOLOAD);
    CUresult (*real_launch)(H, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                            unsigned, H, void **, void **) =
        real_lib ? dlsym(real_lib, "cuLaunchKernel") : NULL;
    if (!real_launch || (void *)real_launch == (void *)cuLaunchKernel) {
        fprintf(stderr, "launch-ab: no cuLaunchKernel of its own in %s\n", search.found);
        return 2;
    }
    H function, stream;
    CHECK(cuStreamCreate(&stream, 1 /* NON_BLOCKING */));
    CHECK(cuModuleGetFunction(&function, module, "empty_100ns"));
    /* AB_KERNELS=K (2-8): the bursts take K empty kernels in turn, as a framework's
     * launches change kernel every launch (no thread's tab covers them). */
    const char *kernels = getenv("AB_KERNELS");
    ab_kernels = kernels ? atoi(kernels) : 1;
    if (ab_kernels < 1 || ab_kernels > AB_MAX_KERNELS) ab_kernels = 1;
    for (int k = 0; k < ab_kernels; k++) {
        char name[32];
        snprintf(name, sizeof name, k ? "empty%d_100ns" : "empty_100ns", k);
        CHECK(cuModuleGetFunction(&ab_functions[k], module, name));
    }
    long block = n / (2 * AB_BLOCKS);
    if (block < AB_BURST) block = AB_BURST;
    /* Warm-up of 1.5 s through the shim (the limiter learns the kernel, the host's
     * coordinator settles), and a little through the real driver. */
    for (double w0 = now_s(); now_s() - w0 < 1.5;) timed_launches(cuLaunchKernel, function, stream, 1024);
    timed_launches(real_launch, function, stream, 4096);
    double shim_ns[AB_BLOCKS], real_ns[AB_BLOCKS], ratios[AB_BLOCKS];
    for (int b = 0; b < AB_BLOCKS; b++) {
        int shim_first = (b % 4 == 0 || b % 4 == 3); /* ABBA */
        double first = timed_launches(shim_first ? cuLaunchKernel : real_launch, function, stream, block);
        double second = timed_launches(shim_first ? real_launch : cuLaunchKernel, function, stream, block);
        shim_ns[b] = (shim_first ? first : second) / block * 1e9;
        real_ns[b] = (shim_first ? second : first) / block * 1e9;
        ratios[b] = shim_ns[b] / real_ns[b];
    }
    double ratio = median(ratios, AB_BLOCKS);
    printf("{\"case\": \"launch-ab\", \"kernels\": %d, \"blocks\": %d, \"launches_per_block\": %ld, "
           "\"shim_ns\": %.1f, \"real_ns\": %.1f, \"ratio\": %.4f, \"shim\": \"%s\", \"real\": \"%s\"}\n",
           ab_kernels, AB_BLOCKS, block, median(shim_ns, AB_BLOCKS), median(real_ns, AB_BLOCKS), ratio,
           search.shim, search.found);
    return 0;
}

/* `launch` and `launch-serve`: an empty kernel on a stream of its own. */
static H empty_function, empty_stream;
static unsigned long long empty_ns = 0;
static void *empty_params[] = {&empty_ns};

static void launch_setup(void) {
    empty_stream = stream_new();
    CHECK(cuModuleGetFunction(&empty_function, module, "empty_100ns"));
    // Warm-up of 1.5 s, in steady state the way a server is: the limiter has learnt the
    // kernel, and the host's coordinator has compared its figures with the card's.
    for (double w0 = now_s(); now_s() - w0 < 1.5;)
        for (int i = 0; i < 1000; i++)
            CHECK(cuLaunchKernel(empty_function, 1, 1, 1, 32, 1, 1, 0, empty_stream, empty_params, NULL));
    CHECK(cuStreamSynchronize(empty_stream));
}

/* N launches of the empty kernel, then a synchronisation; the seconds the launches took
 * (the synchronisation not counted). */
static double empty_launches(long n) {
    double t0 = now_s();
    for (long i = 0; i < n; i++)
        CHECK(cuLaunchKernel(empty_function, 1, 1, 1, 32, 1, 1, 0, empty_stream, empty_params, NULL));
    double t1 = now_s();
    CHECK(cuStreamSynchronize(empty_stream));
    return t1 - t0;
}

/* `launch-serve N`: set up as `launch` does, say so on stdout, then serve rounds for a
 * coordinator (limiter/pairs.py), one a line read from stdin: N launches timed as
 * `launch` times them, a synchronisation, one JSON line with the round's ns a launch.
 * Between rounds it waits in the read (no CPU, no GPU work). Ends (status 0) on EOF or a
 * line `quit`; a write that fails (the reader gone: SIGPIPE is ignored) ends it with 3. */
static int launch_serve(long n) {
    if (n < 1) return 1;
    signal(SIGPIPE, SIG_IGN);
    launch_setup();
    if (printf("{\"case\": \"launch-serve\", \"ready\": true, \"n\": %ld}\n", n) < 0 || fflush(stdout))
        return 3;
    char line[256];
    for (long served = 0; fgets(line, sizeof line, stdin); served++) {
        if (!strncmp(line, "quit", 4) && (line[4] == '\n' || line[4] == '\0')) break;
        double spent = empty_launches(n);
        if (printf("{\"case\": \"launch-serve\", \"round\": %ld, \"n\": %ld, \"per_launch_ns\": %.1f}\n",
                   served, n, spent / n * 1e9) < 0 ||
            fflush(stdout))
            return 3;
    }
    return 0;
}

static const char *SWEEP[] = {"q1x100us", "q2x100us", "q4x100us", "q8x100us", "q1x1ms",
                              "q2x1ms",   "q4x1ms",   "q8x1ms",   "f100us",   "f1ms",
                              "f10ms",    "g100us",   "w1ms"};

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: streams sweep SECONDS | run CASE SECONDS [windows] | launch N"
                        " | launch-serve N | launch-ab N\n");
        return 1;
    }
    start();
    if (!strcmp(argv[1], "sweep")) {
        for (size_t i = 0; i < sizeof SWEEP / sizeof *SWEEP; i++) run_case(SWEEP[i], atof(argv[2]), 0);
    } else if (!strcmp(argv[1], "run") && argc >= 4) {
        run_case(argv[2], atof(argv[3]), argc > 4 && !strcmp(argv[4], "windows"));
    } else if (!strcmp(argv[1], "launch-ab")) {
        return launch_ab(atol(argv[2]));
    } else if (!strcmp(argv[1], "launch")) {
        long n = atol(argv[2]);
        launch_setup();
        double spent = empty_launches(n);
        printf("{\"case\": \"launch\", \"n\": %ld, \"per_launch_us\": %.4f}\n", n, spent / n * 1e6);
    } else if (!strcmp(argv[1], "launch-serve")) {
        return launch_serve(atol(argv[2]));
    } else {
        return 1;
    }
    return 0;
}

// What a sample of a launch into an idle stream times, on the bare driver. For an
// empty kernel and kernels that spin 2, 5 and 20 us (by %globaltimer), each launched
// into an idle stream and waited for before the next, as the limiter brackets a sampled
// launch: the events' elapsed time, the launch call's host time, and the kernel's own
// time as the limiter takes it (the events' time less the host's time before the
// kernel's submission) with the reference event's host time taken two ways: the middle
// of its wait (record call to first query that saw it fired) and the start of its
// record call. Beside them what the card spends per kernel queued back to back (behind
// a 3 ms spin) and the bare launch loop's time per launch. Then what the card's own
// account (NVML's utilization samples) makes of 2 s of each kind launched one at a time
// and 2 s queued back to back: its busy time per kernel, to set beside the samples' and
// the back-to-back figures. One JSON line per figure.
// Diagnostic for the launch-cost check of tests/gpu/limiter/run_limiter.sh.
//
//   cc -O2 -o idle_sample idle_sample.c -ldl && ./idle_sample
#include "driver.h"

#include <string.h>

static const char PTX[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry empty(.param .u64 p) { ret; }\n"
    ".visible .entry spin(.param .u64 p) {\n"
    " .reg .u64 %rd<5>;\n .reg .pred %p1;\n"
    " ld.param.u64 %rd1, [p];\n mov.u64 %rd2, %globaltimer;\n"
    "SPIN:\n mov.u64 %rd3, %globaltimer;\n sub.u64 %rd4, %rd3, %rd2;\n"
    " setp.lt.u64 %p1, %rd4, %rd1;\n @%p1 bra SPIN;\n ret;\n}\n";

static H empty_fn, spin_fn;

typedef struct {
    unsigned long long timestamp;
    unsigned long long value;
} NvmlSample;
static int (*nvmlInit_v2)(void);
static int (*nvmlDeviceGetHandleByIndex_v2)(unsigned, H *);
static int (*nvmlDeviceGetSamples)(H, int, unsigned long long, int *, unsigned *, NvmlSample *);
static H nvml_device;

static unsigned long long wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec * 1000000ULL + ts.tv_nsec / 1000;
}

// The mean of NVML's GPU utilization samples taken within (`since_us`, `until_us`]
// (wall clock), or -1.
static double nvml_busy_between(unsigned long long since_us, unsigned long long until_us) {
    static NvmlSample samples[4096];
    unsigned count = 4096;
    int type = 0;
    if (!nvmlDeviceGetSamples || nvmlDeviceGetSamples(nvml_device, 1, since_us, &type, &count,
                                                      samples) != 0 || count == 0)
        return -1;
    double sum = 0;
    unsigned used = 0;
    for (unsigned i = 0; i < count && i < 4096; i++) {
        if (samples[i].timestamp <= since_us || samples[i].timestamp > until_us) continue;
        sum += type == 1 ? (double)(unsigned)samples[i].value : (double)samples[i].value;
        used++;
    }
    return used ? sum / used : -1;
}

static void launch(long long spin_ns, H stream) {
    unsigned long long arg = (unsigned long long)spin_ns;
    void *params[] = {&arg};
    CHECK(cuLaunchKernel(spin_ns > 0 ? spin_fn : empty_fn, 1, 1, 1, 32, 1, 1, 0, stream, params,
                         NULL));
}

static float elapsed_ns(H a, H b) {
    float ms = 0;
    CHECK(cuEventElapsedTime(&ms, a, b));
    return ms * 1e6f;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Median, 10th and 90th percentile of `n` values (sorted in place).
static void quantiles(double *v, int n, double out[3]) {
    qsort(v, n, sizeof *v, by_value);
    out[0] = v[n / 10];
    out[1] = v[n / 2];
    out[2] = v[n * 9 / 10];
}

// A reference on the clock's own idle stream: record at `*recorded`, first seen fired at
// `*seen`; tried until seen within 20 us, as the limiter's GpuClock does.
static void take_reference(H event, H stream, long long *recorded, long long *seen) {
    for (;;) {
        *recorded = now_ns();
        CHECK(cuEventRecord(event, stream));
        while (cuEventQuery(event) != 0) {
        }
        *seen = now_ns();
        if (*seen - *recorded <= 20000) return;
    }
}

#define N 3000
static double most[N], elapsed[N], k_mid[N], k_rec[N], window[N], call[N];

int main(void) {
    if (load_driver()) return 1;
    H stream, clock_stream, module, start, end, reference;
    create_context();
    CHECK(cuStreamCreate(&stream, 1));
    CHECK(cuStreamCreate(&clock_stream, 1));
    CHECK(cuEventCreate(&start, 0));
    CHECK(cuEventCreate(&end, 0));
    CHECK(cuEventCreate(&reference, 0));
    CHECK(cuModuleLoadData(&module, PTX));
    CHECK(cuModuleGetFunction(&empty_fn, module, "empty"));
    CHECK(cuModuleGetFunction(&spin_fn, module, "spin"));
    long long kinds[] = {0, 2000, 5000, 20000};
    for (int k = 0; k < 4; k++) {
        long long spin = kinds[k];
        for (int i = 0; i < 200; i++) launch(spin, stream);
        CHECK(cuStreamSynchronize(stream));
        long long ref_recorded = 0, ref_seen = 0;
        for (int i = 0; i < N; i++) {
            if (i % 100 == 0) take_reference(reference, clock_stream, &ref_recorded, &ref_seen);
            long long r0 = now_ns();
            CHECK(cuEventRecord(start, stream));
            long long recorded = now_ns();
            launch(spin, stream);
            long long returned = now_ns();
            CHECK(cuEventRecord(end, stream));
            CHECK(cuStreamSynchronize(stream));
            double e = elapsed_ns(start, end), to_start = elapsed_ns(reference, start);
            double believed = ref_recorded + (ref_seen - ref_recorded) / 2.0;
            double fired_mid = believed + to_start, fired_rec = ref_recorded + to_start;
            double m = (double)(returned - recorded);
            double gap_mid = returned - fired_mid, gap_rec = returned - fired_rec;
            gap_mid = gap_mid < 0 ? 0 : gap_mid > m ? m : gap_mid;
            gap_rec = gap_rec < 0 ? 0 : gap_rec > m ? m : gap_rec;
            most[i] = m;
            call[i] = (double)(returned - r0);
            elapsed[i] = e;
            k_mid[i] = e - gap_mid > e / 4 ? e - gap_mid : e / 4;
            k_rec[i] = e - gap_rec > e / 4 ? e - gap_rec : e / 4;
            window[i] = (double)(ref_seen - ref_recorded);
        }
        double q[6][3];
        quantiles(elapsed, N, q[0]);
        quantiles(most, N, q[1]);
        quantiles(k_mid, N, q[2]);
        quantiles(k_rec, N, q[3]);
        quantiles(window, N, q[4]);
        quantiles(call, N, q[5]);
        // Back to back: queued behind a 3 ms spin, so every launch is in before the
        // first runs; the card's time per kernel with its set-up hidden.
        H a = start, b = end;
        launch(3000000, stream);
        CHECK(cuEventRecord(a, stream));
        int queued = spin > 10000 ? 100 : 400;
        for (int i = 0; i < queued; i++) launch(spin, stream);
        CHECK(cuEventRecord(b, stream));
        CHECK(cuStreamSynchronize(stream));
        double back_to_back = elapsed_ns(a, b) / queued;
        // The bare launch loop (host-bound for short kernels).
        long long t0 = now_ns();
        int loop = 20000;
        for (int i = 0; i < loop; i++) launch(spin, stream);
        long long t1 = now_ns();
        CHECK(cuStreamSynchronize(stream));
        printf("{\"spin_ns\": %lld, \"samples\": %d, \"elapsed\": [%.0f, %.0f, %.0f], "
               "\"launch_call\": [%.0f, %.0f, %.0f], \"record_to_return\": [%.0f, %.0f, %.0f], "
               "\"kernel_ref_middle\": [%.0f, %.0f, %.0f], "
               "\"kernel_ref_record\": [%.0f, %.0f, %.0f], "
               "\"reference_wait\": [%.0f, %.0f, %.0f], \"back_to_back\": %.0f, "
               "\"loop_per_launch\": %.0f, \"loop_drained_per_launch\": %.0f}\n",
               spin, N, q[0][0], q[0][1], q[0][2], q[1][0], q[1][1], q[1][2], q[5][0],
               q[5][1], q[5][2], q[2][0], q[2][1], q[2][2], q[3][0], q[3][1], q[3][2],
               q[4][0], q[4][1], q[4][2], back_to_back, (double)(t1 - t0) / loop,
               (double)(now_ns() - t0) / loop);
        fflush(stdout);
    }
    // The card's own account: 2 s of each kind one at a time, then 2 s back to back.
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (nvml) {
        *(void **)&nvmlInit_v2 = dlsym(nvml, "nvmlInit_v2");
        *(void **)&nvmlDeviceGetHandleByIndex_v2 = dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
        *(void **)&nvmlDeviceGetSamples = dlsym(nvml, "nvmlDeviceGetSamples");
    }
    if (!nvmlInit_v2 || nvmlInit_v2() != 0 || nvmlDeviceGetHandleByIndex_v2(0, &nvml_device) != 0) {
        printf("{\"nvml\": \"unavailable\"}\n");
        return 0;
    }
    for (int k = 0; k < 4; k++) {
        long long spin = kinds[k];
        for (int queued = 0; queued < 2; queued++) {
            CHECK(cuStreamSynchronize(stream));
            // NVML's samples from 0.3 s in (each covers the period before it) to the end.
            unsigned long long since = wall_us() + 300000;
            long long t0 = now_ns(), deadline = t0 + 2000000000LL;
            long n = 0;
            while (now_ns() < deadline) {
                launch(spin, stream);
                n++;
                if (!queued) CHECK(cuStreamSynchronize(stream));
                else if (n % 256 == 0) {
                    // Keep at most a few thousand queued.
                    CHECK(cuEventRecord(end, stream));
                    if (n % 4096 == 0) CHECK(cuStreamSynchronize(stream));
                }
            }
            unsigned long long until = wall_us();
            CHECK(cuStreamSynchronize(stream));
            double span = (double)(now_ns() - t0);
            double busy = nvml_busy_between(since, until);
            printf("{\"nvml_spin_ns\": %lld, \"mode\": \"%s\", \"kernels\": %ld, "
                   "\"period_ns\": %.0f, \"nvml_busy_percent\": %.1f, "
                   "\"nvml_busy_per_kernel_ns\": %.0f}\n",
                   spin, queued ? "back_to_back" : "one_at_a_time", n, span / n, busy,
                   busy < 0 ? -1.0 : busy / 100.0 * span / n);
            fflush(stdout);
        }
    }
    return 0;
}

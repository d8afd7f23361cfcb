// What the limiter's building blocks cost on this machine, on the bare driver: the
// clocks, a system call, the driver calls a sampled launch makes, and empty-kernel
// launches with and without a pair of timing events every N launches (what sampling
// adds to a launch loop). One JSON line per figure. Diagnostic for the launch-cost
// check of tests/gpu/limiter/run_limiter.sh.
//
//   cc -O2 -o costs costs.c -ldl && ./costs PTX_FILE
#include "driver.h"

#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char PTX[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry empty(.param .u64 p) { ret; }\n";

static double now_s(void) { return now_ns() * 1e-9; }

#define TIME(label, n, body)                                              \
    do {                                                                  \
        double t0_ = now_s();                                             \
        for (long i_ = 0; i_ < (n); i_++) { body; }                       \
        printf("{\"cost\": \"%s\", \"ns\": %.1f}\n", label,              \
               (now_s() - t0_) / (n) * 1e9);                              \
    } while (0)

int main(void) {
    if (load_driver()) return 1;
    char source[128] = "?";
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
    if (f) { if (fscanf(f, "%127s", source) != 1) strcpy(source, "?"); fclose(f); }
    printf("{\"clocksource\": \"%s\"}\n", source);
    struct timespec ts;
    TIME("clock_gettime_monotonic", 1000000, clock_gettime(CLOCK_MONOTONIC, &ts));
    TIME("clock_gettime_coarse", 1000000, clock_gettime(CLOCK_MONOTONIC_COARSE, &ts));
    TIME("syscall_getppid", 200000, syscall(SYS_getppid));

    H stream, module, function, start, end;
    create_context();
    CHECK(cuStreamCreate(&stream, 1));
    CHECK(cuEventCreate(&start, 0));
    CHECK(cuEventCreate(&end, 0));
    CHECK(cuModuleLoadData(&module, PTX));
    CHECK(cuModuleGetFunction(&function, module, "empty"));
    unsigned long long arg = 0;
    void *params[] = {&arg};
    H current;
    int capturing;
    TIME("cuCtxGetCurrent", 1000000, cuCtxGetCurrent(&current));
    TIME("cuStreamIsCapturing", 1000000, cuStreamIsCapturing(stream, &capturing));
    TIME("cuEventRecord_idle", 100000, cuEventRecord(end, stream));
    CHECK(cuStreamSynchronize(stream));
    TIME("cuEventQuery_done", 1000000, cuEventQuery(end));
    float ms;
    CHECK(cuEventRecord(start, stream));
    CHECK(cuEventRecord(end, stream));
    CHECK(cuStreamSynchronize(stream));
    TIME("cuEventElapsedTime", 1000000, cuEventElapsedTime(&ms, start, end));
    unsigned mode = 2; /* CU_STREAM_CAPTURE_MODE_RELAXED */
    TIME("cuThreadExchangeStreamCaptureMode", 1000000, cuThreadExchangeStreamCaptureMode(&mode));
    // Launch loops: warm, then 200k launches bare, with an event pair every 50, every 500.
    for (int round = 0; round < 2; round++) {
        long every_of[] = {0, 50, 500};
        for (int k = 0; k < 3; k++) {
            long every = every_of[k];
            long n = 200000;
            CHECK(cuStreamSynchronize(stream));
            double t0 = now_s();
            for (long i = 0; i < n; i++) {
                int sampled = every && i % every == 0;
                if (sampled) CHECK(cuEventRecord(start, stream));
                CHECK(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
                if (sampled) CHECK(cuEventRecord(end, stream));
            }
            double t1 = now_s();
            CHECK(cuStreamSynchronize(stream));
            printf("{\"launch_loop\": %d, \"events_every\": %ld, \"per_launch_ns\": %.1f, "
                   "\"drained_ns\": %.1f}\n",
                   round, every, (t1 - t0) / n * 1e9, (now_s() - t0) / n * 1e9);
        }
    }
    // Cold: what a sample and its settle cost inside a launch loop, where the launches
    // between evict the driver's lines (the limiter's trace times a settle at about
    // 11 us on an H100 against the microsecond the calls take in the loops above). Every
    // 300 launches: the sampled launch's context read and two records, then the previous
    // sample's settle (the capture mode set relaxed, a query, three elapsed times, the
    // mode back), each call timed on its own.
    {
        enum { CTX, RECORD_START, RECORD_END, ENTER, QUERY, ELAPSED1, ELAPSED2, ELAPSED3, LEAVE, PARTS };
        static const char *names[PARTS] = {"ctx", "record_start", "record_end", "enter_relaxed",
                                           "query", "elapsed_1", "elapsed_2", "elapsed_3",
                                           "leave_relaxed"};
        double sum[PARTS] = {0};
        long rounds = 1000, between = 300, settled = 0;
        H reference, pending_start = start, pending_end = end;
        CHECK(cuEventCreate(&reference, 0));
        CHECK(cuEventRecord(reference, stream));
        CHECK(cuStreamSynchronize(stream));
        long long t;
#define PART(part, call) do { t = now_ns(); CHECK(call); sum[part] += now_ns() - t; } while (0)
        for (long r = 0; r < rounds; r++) {
            for (long i = 0; i < between; i++)
                CHECK(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
            PART(CTX, cuCtxGetCurrent(&current));
            PART(RECORD_START, cuEventRecord(pending_start, stream));
            CHECK(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
            PART(RECORD_END, cuEventRecord(pending_end, stream));
            for (long i = 0; i < between; i++)
                CHECK(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
            mode = 2;
            PART(ENTER, cuThreadExchangeStreamCaptureMode(&mode));
            t = now_ns();
            CUresult done = cuEventQuery(pending_end);
            sum[QUERY] += now_ns() - t;
            if (done == 0) {
                settled++;
                PART(ELAPSED1, cuEventElapsedTime(&ms, pending_start, pending_end));
                PART(ELAPSED2, cuEventElapsedTime(&ms, reference, pending_end));
                PART(ELAPSED3, cuEventElapsedTime(&ms, reference, pending_start));
            }
            PART(LEAVE, cuThreadExchangeStreamCaptureMode(&mode));
        }
#undef PART
        CHECK(cuStreamSynchronize(stream));
        // The elapsed times are averaged over the settles that found the sample done.
        for (int part = 0; part < PARTS; part++)
            printf("{\"cold\": \"%s\", \"ns\": %.1f, \"of\": %ld}\n", names[part],
                   sum[part] / ((part >= ELAPSED1 && part <= ELAPSED3) ? (settled ? settled : 1) : rounds),
                   (part >= ELAPSED1 && part <= ELAPSED3) ? settled : rounds);
    }
    // The same loop with a clock read per launch (what the limiter's fast path adds).
    CHECK(cuStreamSynchronize(stream));
    double t0 = now_s();
    for (long i = 0; i < 200000; i++) {
        clock_gettime(CLOCK_MONOTONIC, &ts);
        CHECK(cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, params, NULL));
    }
    printf("{\"launch_loop\": \"with_clock\", \"per_launch_ns\": %.1f}\n", (now_s() - t0) / 200000 * 1e9);
    CHECK(cuStreamSynchronize(stream));
    return 0;
}

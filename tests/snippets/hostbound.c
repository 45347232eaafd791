/* hostbound.c: the host-bound check (KREX_HOST_BOUND) through each way of reaching cuEventRecord and
 * cuEventElapsedTime. `hostbound MODE PATTERN`: one region "timed" of SNIPPET_N (10) repetitions of PATTERN, each
 * a start event, a kernel, an end event, the intervals read (cuEventElapsedTime) inside the region, then prints
 * "begin=B checked=C late=L" from krex_region_last_timings.
 *   PATTERN gpu:  a long kernel (50 ms) queued, the start recorded, a short kernel launched at once: never late.
 *   PATTERN host: the start recorded on a drained stream and waited for (cuEventSynchronize), 2 ms of host time,
 *                 a short kernel: always late (the GPU waited ~2 ms of a ~2 ms interval).
 *   PATTERN sync: a loop that synchronizes each repetition (KernelBench's): a 20 ms "flush" kernel, the start,
 *                 a 3 ms kernel, the end, a synchronize: never late, though the launch after each end finds it
 *                 complete (an end event is never judged).
 *   PATTERN idle: the start recorded on a drained stream and a 50 ms kernel launched at once: the start had
 *                 completed, but the wait (microseconds) is far under 1% of the interval: never late.
 *   PATTERN endlate: a 20 ms "flush", the start, a 1 ms kernel launched at once (the GPU busy: no wait at the
 *                 start), 40 ms of host time, the end: always late (the GPU waited ~19 ms for the end record).
 *   PATTERN endbusy: a 50 ms kernel queued, the start, a 50 ms kernel, 10 ms of host time, the end: never late
 *                 (the stream still had work when the end was recorded).
 *   PATTERN syncend: a 20 ms "flush", the start, a 50 ms kernel, a synchronize, the end: never late (the host
 *                 waited on the GPU until the end record; it did not keep the GPU waiting).
 *   PATTERN syncv2: syncend with cuCtxSynchronize_v2(NULL) from cuGetProcAddress_v2 (CUDA 13's cudaDeviceSynchronize
 *                 goes there): never late.
 *   PATTERN capture: a record and a launch on the stream, then a capture of it with a record and a launch in it
 *                 (cuStreamBeginCapture_v2 / cuStreamEndCapture from dlsym): the capture ends well (the record
 *                 inside it is not watched, nor its stream asked about); nothing checked.
 *   PATTERN flushdone: a 10 ms "flush", the start, waited for (it completes when the flush does), a 300 ms kernel
 *                 at once: the host's time from the record to the launch is 10 ms (3%), the GPU's wait is not.
 * SNIPPET_READS (1): how many times each interval is read (one count however often). SNIPPET_REUSE=1: one pair of
 * events recorded again each repetition and read after a synchronize (KernelBench's), in every pattern.
 *   PATTERN many: starts recorded on 17 streams of its own (the check's table holds 16: the first gives way), the
 *                 first stream's completing at once and the others' behind a 50 ms kernel, then a short kernel and
 *                 an end on each, all read: 16 checked, 0 late (the first stream's, which would be late, was
 *                 rightly given up).
 * After the repetitions, an event recorded and destroyed before the next launch: never asked (not checked).
 *   MODE direct         cuEventRecord / cuEventElapsedTime / cuLaunchKernel as linked, on a stream of its own
 *   MODE legacy         the same on the NULL (legacy default) stream
 *   MODE dlsym          cuEventRecord and cuEventElapsedTime from dlsym(libcuda)
 *   MODE withflags      cuEventRecordWithFlags from dlsym(libcuda)
 *   MODE procaddr-v1    cuEventRecord and cuEventElapsedTime from cuGetProcAddress
 *   MODE procaddr-v2    cuEventRecordWithFlags and cuEventElapsedTime_v2 from cuGetProcAddress_v2
 *   MODE procaddr-ptsz  cuEventRecord and cuLaunchKernel from cuGetProcAddress_v2 with the per-thread default
 *                       stream flag (their _ptsz twins), on the NULL (per-thread default) stream
 * `hostbound which`: prints, for cuEventRecord, cuEventElapsedTime, cuEventDestroy_v2, cuStreamSynchronize and
 * cuCtxSynchronize_v2 as dlsym and cuGetProcAddress give them, the file each lives in ("libkrex.so": the shim's
 * wrapper; the driver's file: the driver's own function), then the file and name of what cuGetProcAddress gives
 * for cuCtxSynchronize at 13000. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>
#include "../../shim/krex.h"
#include "common.h"

typedef CUresult (*record_t)(CUevent, CUstream);
typedef CUresult (*record_flags_t)(CUevent, CUstream, unsigned);
typedef CUresult (*destroy_t)(CUevent);
typedef CUresult (*elapsed_t)(float *, CUevent, CUevent);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void **, void **);
typedef CUresult (*gpa1_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*gpa2_t)(const char *, void **, int, cuuint64_t, int *);
typedef CUresult (*capbeg_t)(CUstream, int);
typedef CUresult (*capend_t)(CUstream, CUgraph *);
typedef CUresult (*ctx_sync_v2_t)(CUcontext);

static void *lib;
static record_t record;
static record_flags_t record_flags;
static elapsed_t elapsed = cuEventElapsedTime;

static void *sym(const char *n) { return snippet_sym(lib, "hostbound", n); }

static void *proc(const char *n, cuuint64_t flags) {
    void *p = NULL;
    int st = -1;
    CHECK(((gpa2_t)sym("cuGetProcAddress_v2"))(n, &p, 12000, flags, &st));
    if (!p || st != 0) exit(12);
    return p;
}

static void *proc13(const char *n) {      /* a CUDA 13 function: asked for at 13000 */
    void *p = NULL;
    int st = -1;
    CHECK(((gpa2_t)sym("cuGetProcAddress_v2"))(n, &p, 13000, 0, &st));
    if (!p || st != 0) exit(12);
    return p;
}

static const char *home(void *p) {
    Dl_info info;
    if (!dladdr(p, &info) || !info.dli_fname) return "?";
    const char *slash = strrchr(info.dli_fname, '/');
    return slash ? slash + 1 : info.dli_fname;
}

static CUresult record_event(CUevent e, CUstream s) { return record ? record(e, s) : record_flags(e, s, 0); }

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "direct", *pattern = argc > 2 ? argv[2] : "gpu";
    int n = env_int("SNIPPET_N", 10), reads = env_int("SNIPPET_READS", 1), reuse = env_int("SNIPPET_REUSE", 0);
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!strcmp(mode, "which")) {
        const char *names[] = {"cuEventRecord", "cuEventElapsedTime", "cuEventDestroy_v2", "cuStreamSynchronize",
                               "cuCtxSynchronize_v2"};
        for (int i = 0; i < 5; i++) {
            void *p = NULL;
            CHECK(((gpa1_t)sym("cuGetProcAddress"))(names[i], &p, i == 4 ? 13000 : 11030, 0));
            printf("%s dlsym=%s procaddr=%s\n", names[i], home(sym(names[i])), home(p));
        }
        /* CUDA 13's cuCtxSynchronize_v2 is a function of its own: the base name at 13000 is still the (void) one */
        void *p = NULL;
        Dl_info info;
        CHECK(((gpa1_t)sym("cuGetProcAddress"))("cuCtxSynchronize", &p, 13000, 0));
        printf("cuCtxSynchronize@13000 procaddr=%s:%s\n", home(p),
               dladdr(p, &info) && info.dli_sname ? info.dli_sname : "?");
        return 0;
    }
    CUfunction f = snippet_kernel("timed", NULL);
    CUstream s = NULL;
    launch_t launch = cuLaunchKernel;
    if (strcmp(mode, "legacy") && strcmp(mode, "procaddr-ptsz")) CHECK(cuStreamCreate(&s, 0));
    if (!strcmp(mode, "direct") || !strcmp(mode, "legacy")) record = cuEventRecord;
    else if (!strcmp(mode, "dlsym")) {
        record = (record_t)sym("cuEventRecord");
        elapsed = (elapsed_t)sym("cuEventElapsedTime");
    } else if (!strcmp(mode, "withflags")) record_flags = (record_flags_t)sym("cuEventRecordWithFlags");
    else if (!strcmp(mode, "procaddr-v1")) {
        void *p = NULL, *q = NULL;
        CHECK(((gpa1_t)sym("cuGetProcAddress"))("cuEventRecord", &p, 11030, 0));
        CHECK(((gpa1_t)sym("cuGetProcAddress"))("cuEventElapsedTime", &q, 11030, 0));
        record = (record_t)p, elapsed = (elapsed_t)q;
    } else if (!strcmp(mode, "procaddr-v2")) {
        record_flags = (record_flags_t)proc("cuEventRecordWithFlags", 0);
        elapsed = (elapsed_t)proc("cuEventElapsedTime_v2", 0);
    } else if (!strcmp(mode, "procaddr-ptsz")) {
        record = (record_t)proc("cuEventRecord", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
        launch = (launch_t)proc("cuLaunchKernel", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
    } else {
        fprintf(stderr, "hostbound: unknown mode %s\n", mode);
        return 2;
    }
    enum { REPS = 64, MANY = 17 };
    if (n > REPS) n = REPS;
    CUevent start[REPS], end[REPS], gone;
    for (int i = 0; i < REPS; i++) {
        CHECK(cuEventCreate(&start[i], 0));
        CHECK(cuEventCreate(&end[i], 0));
    }
    CHECK(cuEventCreate(&gone, 0));
    float ms;
    int b = krex_begin("timed");
    if (!strcmp(pattern, "many")) {
        CUstream many[MANY];
        for (int i = 0; i < MANY; i++) {
            CHECK(cuStreamCreate(&many[i], 0));
            if (i) CHECK(launch(f, 50000, 1, 1, 1, 1, 1, 0, many[i], NULL, NULL));   /* pending starts */
            CHECK(record_event(start[i], many[i]));
        }
        /* every launch first: an end recorded before the next stream's launch would take that stream's place */
        for (int i = 0; i < MANY; i++) CHECK(launch(f, 10, 1, 1, 1, 1, 1, 0, many[i], NULL, NULL));
        for (int i = 0; i < MANY; i++) CHECK(record_event(end[i], many[i]));
        for (int i = 0; i < MANY; i++) CHECK(cuStreamSynchronize(many[i]));
        for (int i = 0; i < MANY; i++) CHECK(elapsed(&ms, start[i], end[i]));
        n = 0;
    }
    if (!strcmp(pattern, "capture")) {
        CUgraph g;
        CHECK(record_event(start[0], s));
        CHECK(launch(f, 10, 1, 1, 1, 1, 1, 0, s, NULL, NULL));   /* launches since the stream's last record */
        CHECK(((capbeg_t)sym("cuStreamBeginCapture_v2"))(s, 0));
        CHECK(record_event(end[0], s));                            /* a graph node */
        CHECK(launch(f, 10, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        CHECK(((capend_t)sym("cuStreamEndCapture"))(s, &g));
        n = 0;
    }
    for (int i = 0; i < n; i++) {
        int k = reuse ? 0 : i;                     /* the event pair of this repetition */
        if (!strcmp(pattern, "host")) {
            CHECK(cuStreamSynchronize(s));
            CHECK(record_event(start[k], s));
            CHECK(cuEventSynchronize(start[k]));   /* complete before the launch, whatever the load */
            usleep(2000);                          /* the host is slow */
            CHECK(launch(f, 10, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        } else if (!strcmp(pattern, "sync")) {
            CHECK(cuStreamSynchronize(s));
            CHECK(launch(f, 20000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));   /* the "flush" */
            CHECK(record_event(start[k], s));
            CHECK(launch(f, 3000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        } else if (!strcmp(pattern, "flushdone")) {
            CHECK(cuStreamSynchronize(s));
            CHECK(launch(f, 10000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));   /* the "flush" */
            CHECK(record_event(start[k], s));
            CHECK(cuEventSynchronize(start[k]));   /* the flush is done: the start completes with it */
            CHECK(launch(f, 300000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
            CHECK(record_event(end[k], s));
            continue;
        } else if (!strcmp(pattern, "endlate")) {
            CHECK(cuStreamSynchronize(s));
            CHECK(launch(f, 20000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));   /* the "flush" */
            CHECK(record_event(start[k], s));
            CHECK(launch(f, 1000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
            usleep(40000);                         /* the host is slow to record the end */
        } else if (!strcmp(pattern, "syncend") || !strcmp(pattern, "syncv2")) {
            CHECK(cuStreamSynchronize(s));
            CHECK(launch(f, 20000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));   /* the "flush" */
            CHECK(record_event(start[k], s));
            CHECK(launch(f, 50000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
            if (!strcmp(pattern, "syncv2")) CHECK(((ctx_sync_v2_t)proc13("cuCtxSynchronize_v2"))(NULL));
            else CHECK(cuStreamSynchronize(s));    /* the host waits for the GPU, then records the end at once */
        } else if (!strcmp(pattern, "endbusy")) {
            CHECK(launch(f, 50000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
            CHECK(record_event(start[k], s));
            CHECK(launch(f, 50000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
            usleep(10000);
        } else if (!strcmp(pattern, "idle")) {
            CHECK(cuStreamSynchronize(s));
            CHECK(record_event(start[k], s));
            CHECK(launch(f, 50000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        } else {
            CHECK(launch(f, 50000, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
            CHECK(record_event(start[k], s));
            CHECK(launch(f, 10, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
        }
        CHECK(record_event(end[k], s));
        if (!strcmp(pattern, "sync") || reuse) {
            CHECK(cuStreamSynchronize(s));
            CHECK(elapsed(&ms, start[k], end[k]));   /* read each repetition, as KernelBench does */
        }
    }
    CHECK(cuStreamSynchronize(s));
    if (strcmp(pattern, "sync") && !reuse)
        for (int r = 0; r < reads; r++)
            for (int i = 0; i < n; i++) CHECK(elapsed(&ms, start[i], end[i]));   /* read at the end, as do_bench */
    CHECK(record_event(gone, s));
    CHECK(((destroy_t)sym("cuEventDestroy_v2"))(gone));
    CHECK(launch(f, 10, 1, 1, 1, 1, 1, 0, s, NULL, NULL));   /* its event was destroyed: not asked */
    CHECK(cuStreamSynchronize(s));
    krex_end();
    uint32_t checked = 0, late = 0;
    if (krex_region_last_timings) krex_region_last_timings(&checked, &late);
    printf("begin=%d checked=%u late=%u\n", b, checked, late);
    return 0;
}

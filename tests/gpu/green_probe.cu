// green_probe.cu: a GPU process that queues work in a green context and then looks idle.
// Retains the device's primary context, makes a green context of all its SMs (cuGreenCtxCreate), queues
// LAUNCHES spin kernels of MS milliseconds each (BLOCKS blocks) in it, makes the primary context current again,
// with GREEN_SYNC_PRIMARY set synchronizes that one, prints "idle <ns> sms <n> pid <pid>" (CLOCK_MONOTONIC)
// and sleeps until the file STOP exists; then prints "green <start_ns> <end_ns>": when its kernels began and ended
// (the host's clock when the start event was recorded on an idle stream, plus the events' elapsed time).
//   green_probe LAUNCHES MS BLOCKS STOP
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define CK(x) do { CUresult r_ = (x); if (r_) { fprintf(stderr, "%s: %d\n", #x, (int)r_); return 10; } } while (0)

__global__ void spin(long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    int launches = atoi(argv[1]), ms = atoi(argv[2]), blocks = atoi(argv[3]);
    const char *stop = argv[4];
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext primary, green_ctx;
    CK(cuDevicePrimaryCtxRetain(&primary, dev));
    CK(cuCtxSetCurrent(primary));
    int khz = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) != cudaSuccess || khz <= 0) khz = 1980000;
    CUdevResource sms;
    CK(cuDeviceGetDevResource(dev, &sms, CU_DEV_RESOURCE_TYPE_SM));
    CUdevResourceDesc desc;
    CK(cuDevResourceGenerateDesc(&desc, &sms, 1));
    CUgreenCtx green;
    CK(cuGreenCtxCreate(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CK(cuCtxFromGreenCtx(&green_ctx, green));
    CK(cuCtxSetCurrent(green_ctx));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUevent start, end;
    CK(cuEventCreate(&start, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&end, CU_EVENT_DEFAULT));
    CK(cuEventRecord(start, s));
    long long start_ns = now_ns();
    for (int i = 0; i < launches; i++) spin<<<blocks, 1, 0, (cudaStream_t)s>>>((long long)khz * ms);
    if (cudaGetLastError() != cudaSuccess) { fprintf(stderr, "launch failed\n"); return 11; }
    CK(cuEventRecord(end, s));
    CK(cuCtxSetCurrent(primary));
    if (getenv("GREEN_SYNC_PRIMARY")) CK(cuCtxSynchronize());   // the primary context's (on driver 580 it waited for the green work too)
    printf("idle %lld sms %u pid %d\n", now_ns(), sms.sm.smCount, (int)getpid());
    fflush(stdout);
    while (access(stop, F_OK) != 0) usleep(10000);
    CK(cuCtxSetCurrent(green_ctx));
    CK(cuEventSynchronize(end));
    float ms_all = 0;
    CK(cuEventElapsedTime(&ms_all, start, end));
    printf("green %lld %lld\n", start_ns, start_ns + (long long)(ms_all * 1e6));
    CK(cuGreenCtxDestroy(green));
    return 0;
}

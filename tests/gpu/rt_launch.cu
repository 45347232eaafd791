// rt_launch.cu: a C++ runtime-API program (static cudart, as nvcc links it): N launches with <<<>>> and
// N with cudaLaunchKernel; prints one KREX_ROW line per kind with the shim's count from KREX_COUNTERS.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>

__global__ void touch(int *p) { if (threadIdx.x == 0) atomicAdd(p, 1); }

static long long kernels_seen() {
    const char *path = getenv("KREX_COUNTERS");
    if (!path) return -1;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    unsigned char hdr[64];
    if (fread(hdr, 1, 64, f) != 64) return -1;
    uint32_t next;
    memcpy(&next, hdr + 12, 4);
    long long total = 0;
    for (uint32_t i = 0; i < next; i++) {
        unsigned char slot[64];
        if (fread(slot, 1, 64, f) != 64) break;
        uint64_t k;
        memcpy(&k, slot + 8, 8);
        total += (long long)k;
    }
    fclose(f);
    return total;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    int *d;
    cudaMalloc(&d, sizeof(int));
    cudaMemset(d, 0, sizeof(int));
    touch<<<1, 32>>>(d);
    cudaDeviceSynchronize();
    long long k0 = kernels_seen();
    for (int i = 0; i < n; i++) touch<<<1, 32>>>(d);
    cudaDeviceSynchronize();
    long long k1 = kernels_seen();
    void *args[] = {&d};
    for (int i = 0; i < n; i++) cudaLaunchKernel((const void *)touch, dim3(1), dim3(32), args, 0, 0);
    cudaDeviceSynchronize();
    long long k2 = kernels_seen();
    int h = 0;
    cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
    printf("KREX_ROW {\"workload\": \"c++ runtime <<<>>>\", \"expected\": %d, \"profiler\": null, \"shim\": %lld}\n", n, k1 - k0);
    printf("KREX_ROW {\"workload\": \"c++ runtime cudaLaunchKernel\", \"expected\": %d, \"profiler\": null, \"shim\": %lld, \"device_count\": %d}\n",
           n, k2 - k1, h);
    return 0;
}

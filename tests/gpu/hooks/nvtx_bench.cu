// nvtx_bench.cu: a C++ harness in the nvbench style: an NVTX range named krex_* around its timing loop
// (nvtx3 C API from the CUDA toolkit), cudaEvent timing of a spin kernel.
#include <cstdio>
#include <nvtx3/nvToolsExt.h>

__global__ void spin(unsigned long long ns) {
    unsigned long long t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1)); } while (t1 - t0 < ns);
}

int main() {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    spin<<<132, 32>>>(1000);
    cudaDeviceSynchronize();
    for (int r = 0; r < 3; r++) {
        nvtxRangePushA("krex_nvbench_style");
        cudaEventRecord(e0);
        for (int i = 0; i < 10; i++) spin<<<132, 32>>>(1000000);   // 1 ms each
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        nvtxRangePop();
        float ms;
        cudaEventElapsedTime(&ms, e0, e1);
        printf("{\"round\": %d, \"ms_per_kernel\": %.4f}\n", r, ms / 10);
    }
    return 0;
}

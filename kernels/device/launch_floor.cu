// Launch floor of a chain of dependent kernels in one CUDA graph (the decode loop's shape: ~600
// kernels per frame, each reading what the previous wrote). Prints µs per kernel for grids of
// 132..1056 blocks of 256 threads, with and without programmatic dependent launch (PDL), and
// with the dependents released at the start (after the wait) or at the end of each kernel.
// Build and run: nvcc -O3 -arch=sm_90 -o /tmp/lf kernels/device/launch_floor.cu && /tmp/lf
#include <cstdio>
#include <cuda_runtime.h>

__global__ void k_step(int* v, int early) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    if (blockIdx.x == 0 && threadIdx.x == 0) v[0] += 1;
}

static float chain(int blocks, bool pdl, int early, int n, cudaStream_t s, int* v) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < n; ++i) {
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(256);
        cfg.stream = s;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
        cudaLaunchKernelEx(&cfg, k_step, v, early);
    }
    cudaStreamEndCapture(s, &g);
    cudaGraphInstantiate(&ge, g, 0);
    for (int w = 0; w < 3; ++w) cudaGraphLaunch(ge, s);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, s);
    const int reps = 10;
    for (int r = 0; r < reps; ++r) cudaGraphLaunch(ge, s);
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);
    return ms * 1000.f / (reps * n);
}

int main() {
    cudaStream_t s;
    cudaStreamCreate(&s);
    int* v;
    cudaMalloc(&v, 4);
    printf("| blocks | no PDL µs/kernel | PDL, release at start | PDL, release at exit |\n|---|---|---|---|\n");
    for (int blocks : {1, 132, 264, 528, 1056}) {
        float a = chain(blocks, false, 1, 600, s, v);
        float b = chain(blocks, true, 1, 600, s, v);
        float c = chain(blocks, true, 0, 600, s, v);
        printf("| %d | %.2f | %.2f | %.2f |\n", blocks, a, b, c);
    }
    cudaError_t e = cudaGetLastError();
    printf("status: %s\n", cudaGetErrorString(e));
    return e != cudaSuccess;
}

// ABI entry points that are not kernels of one op: version, errors, device set-up, counters.
#include "common.cuh"

#include <stdarg.h>
#include <stdio.h>

static thread_local char g_err[512] = "";
static int g_warp = 32;
#if defined(Q3T_CUDA)
static int g_cc_major = 0;  // compute capability major of the device passed to q3t_init
static bool g_gemv_cluster = true;
static bool g_gemv_groups = false;
static bool g_i8_mma = false;
#endif
static bool g_pdl = false;
static bool g_i8_deep = false;
static int g_sms = 0;

int q3t_fail(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return -1;
}

int q3t_check_launch(const char* what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return q3t_fail("%s: %s", what, cudaGetErrorString(e));
    return 0;
}

int q3t_host_warp() { return g_warp; }

bool q3t_pdl_enabled() { return g_pdl; }

int q3t_host_sms() { return g_sms; }

bool q3t_i8_deep() { return g_i8_deep; }

#if defined(Q3T_CUDA)
int q3t_host_cc_major() { return g_cc_major; }
bool q3t_gemv_cluster_enabled() { return g_gemv_cluster; }
bool q3t_gemv_groups_enabled() { return g_gemv_groups; }
bool q3t_i8_mma() { return g_i8_mma; }
#endif

__global__ void k_add_i32(int* p, int n, int delta) {
    q3t_grid_dep_trigger_first();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += delta;
}

__global__ void k_store_row(const int* src, int n, int* dst, const int* row_ptr, int max_rows) {
    q3t_grid_dep_trigger_first();
    const int row = *row_ptr;
    if (row < 0 || row >= max_rows) return;
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[(size_t)row * n + i] = src[i];
}

extern "C" {

Q3T_API int q3t_abi_version(void) { return Q3T_ABI_VERSION; }

Q3T_API const char* q3t_last_error(void) { return g_err; }

// Reads the warp width and SM count of `device` (the launchers size their grids from them).
// Call before capturing a graph: it also makes the runtime load this library's kernels.
Q3T_API int q3t_init(int device, int* warp_size, int* sm_count) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) return q3t_fail("no GPU runtime: %s", cudaGetErrorString(e));
    if (device < 0 || device >= n) return q3t_fail("device %d out of range (%d devices)", device, n);
    cudaDeviceProp prop;
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return q3t_fail("cudaGetDeviceProperties: %s", cudaGetErrorString(e));
    g_warp = prop.warpSize;
    g_sms = prop.multiProcessorCount;
#if defined(Q3T_CUDA)
    g_cc_major = prop.major;
#endif
    if (warp_size) *warp_size = prop.warpSize;
    if (sm_count) *sm_count = prop.multiProcessorCount;
    cudaFuncAttributes attr;
    e = cudaFuncGetAttributes(&attr, (const void*)k_add_i32);
    if (e != cudaSuccess) return q3t_fail("kernel image not loadable on device %d: %s", device, cudaGetErrorString(e));
    return 0;
}

Q3T_API int q3t_set_gemv_clusters(int enable) {
#if defined(Q3T_CUDA)
    g_gemv_cluster = enable != 0;
#else
    (void)enable;  // HIP: the tensor-core kernel and its clusters are CUDA-only
#endif
    return 0;
}

Q3T_API int q3t_set_i8_deep(int enable) {
    g_i8_deep = enable != 0;
    return 0;
}

Q3T_API int q3t_set_i8_mma(int enable) {
#if defined(Q3T_CUDA)
    g_i8_mma = enable != 0;
#else
    (void)enable;  // HIP: the int8 tensor-core GEMV is CUDA-only
#endif
    return 0;
}

Q3T_API int q3t_set_gemv_groups(int enable) {
#if defined(Q3T_CUDA)
    g_gemv_groups = enable != 0;
#else
    (void)enable;  // HIP: the tensor-core kernel is CUDA-only
#endif
    return 0;
}

Q3T_API int q3t_set_pdl(int enable) {
#if defined(Q3T_CUDA)
    if (enable && g_cc_major < 9)
        return q3t_fail("programmatic dependent launch needs compute capability 9.0+ (device has %d.x; call q3t_init first)",
                        g_cc_major);
    g_pdl = enable != 0;
    return 0;
#else
    if (enable) return q3t_fail("programmatic dependent launch is CUDA-only");
    g_pdl = false;
    return 0;
#endif
}

Q3T_API int q3t_add_i32(int* p, int n, int delta, void* stream) {
    if (!p || n <= 0) return q3t_fail("q3t_add_i32: bad arguments");
    q3t_launch(k_add_i32, (n + 255) / 256, 256, 0, Q3T_STREAM(stream), p, n, delta);
    return q3t_check_launch("q3t_add_i32");
}

Q3T_API int q3t_store_row(const int* src, int n, int* dst, const int* row_ptr, int max_rows, void* stream) {
    if (!src || !dst || !row_ptr || n <= 0 || n > 1024 || max_rows <= 0) return q3t_fail("q3t_store_row: bad arguments");
    q3t_launch(k_store_row, 1, 64, 0, Q3T_STREAM(stream), src, n, dst, row_ptr, max_rows);
    return q3t_check_launch("q3t_store_row");
}

}  // extern "C"

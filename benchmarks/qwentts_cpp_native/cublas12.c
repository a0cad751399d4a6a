/* A libcublas.so.12 that forwards to cuBLAS 13.
 *
 * Why: the realtimetts-qwen-native 0.2.0 wheel's libggml-cuda.so.0 is built against CUDA 12.8 and needs
 * libcublas.so.12, whose wheel is about 600 MB; the GPU box has cuBLAS 13 (CUDA 13) and takes 64 MiB per call.
 * These are the twelve entry points that library imports (readelf --dyn-syms: cublas*@libcublas.so.12); their C
 * signatures are the same in cuBLAS 12 and 13. Handles, streams and device pointers are driver objects of the one
 * primary context, so a CUDA 12 runtime and cuBLAS 13 can share them. Enums travel as int.
 *
 * cuBLAS 13 is opened on first use from $QCPP_CUBLAS (a path), else by its soname. Two deprecated enum values are
 * mapped to their current equivalents (tensor cores are used by default since cuBLAS 11):
 * CUBLAS_TENSOR_OP_MATH (1) -> CUBLAS_DEFAULT_MATH (0), CUBLAS_GEMM_DEFAULT_TENSOR_OP (99..115) -> CUBLAS_GEMM_DEFAULT.
 *
 * Build: cc -shared -fPIC -O2 -o libcublas.so.12 cublas12.c -Wl,-soname,libcublas.so.12
 *        -Wl,--version-script=cublas12.map -ldl
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int status_t;
typedef void * handle_t;

static void * cublas13(void) {
    static void * lib;
    if (!lib) {
        const char * path = getenv("QCPP_CUBLAS");
        lib = dlopen(path && *path ? path : "libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            fprintf(stderr, "[cublas12 shim] cannot open cuBLAS 13: %s\n", dlerror());
            abort();
        }
    }
    return lib;
}

static void * fn(const char * name) {
    void * f = dlsym(cublas13(), name);
    if (!f) {
        fprintf(stderr, "[cublas12 shim] cuBLAS 13 lacks %s\n", name);
        abort();
    }
    return f;
}

#define FORWARD(ret, name, params, args)   \
    ret name params {                      \
        static ret(*real) params;          \
        if (!real) {                       \
            *(void **) (&real) = fn(#name); \
        }                                  \
        return real args;                  \
    }

static int algo(int a) { return (a >= 99 && a <= 115) ? -1 : a; }
static int math_mode(int m) { return (m & ~16) == 1 ? (m & 16) : m; }

FORWARD(status_t, cublasCreate_v2, (handle_t * h), (h))
FORWARD(status_t, cublasDestroy_v2, (handle_t h), (h))
FORWARD(status_t, cublasSetStream_v2, (handle_t h, void * stream), (h, stream))
FORWARD(const char *, cublasGetStatusString, (status_t s), (s))

status_t cublasSetMathMode(handle_t h, int mode) {
    static status_t (*real)(handle_t, int);
    if (!real) {
        *(void **) (&real) = fn("cublasSetMathMode");
    }
    return real(h, math_mode(mode));
}

FORWARD(status_t, cublasSgemm_v2,
        (handle_t h, int ta, int tb, int m, int n, int k, const float * alpha, const float * A, int lda,
         const float * B, int ldb, const float * beta, float * C, int ldc),
        (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc))
FORWARD(status_t, cublasSgemmBatched,
        (handle_t h, int ta, int tb, int m, int n, int k, const float * alpha, const float * const A[], int lda,
         const float * const B[], int ldb, const float * beta, float * const C[], int ldc, int batch),
        (h, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, batch))
FORWARD(status_t, cublasSgemmStridedBatched,
        (handle_t h, int ta, int tb, int m, int n, int k, const float * alpha, const float * A, int lda,
         long long sa, const float * B, int ldb, long long sb, const float * beta, float * C, int ldc,
         long long sc, int batch),
        (h, ta, tb, m, n, k, alpha, A, lda, sa, B, ldb, sb, beta, C, ldc, sc, batch))
FORWARD(status_t, cublasStrsmBatched,
        (handle_t h, int side, int uplo, int trans, int diag, int m, int n, const float * alpha,
         const float * const A[], int lda, float * const B[], int ldb, int batch),
        (h, side, uplo, trans, diag, m, n, alpha, A, lda, B, ldb, batch))

status_t cublasGemmEx(handle_t h, int ta, int tb, int m, int n, int k, const void * alpha, const void * A, int at,
                      int lda, const void * B, int bt, int ldb, const void * beta, void * C, int ct, int ldc,
                      int compute, int a) {
    static status_t (*real)(handle_t, int, int, int, int, int, const void *, const void *, int, int, const void *,
                            int, int, const void *, void *, int, int, int, int);
    if (!real) {
        *(void **) (&real) = fn("cublasGemmEx");
    }
    return real(h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, compute, algo(a));
}

status_t cublasGemmBatchedEx(handle_t h, int ta, int tb, int m, int n, int k, const void * alpha,
                             const void * const A[], int at, int lda, const void * const B[], int bt, int ldb,
                             const void * beta, void * const C[], int ct, int ldc, int batch, int compute, int a) {
    static status_t (*real)(handle_t, int, int, int, int, int, const void *, const void * const *, int, int,
                            const void * const *, int, int, const void *, void * const *, int, int, int, int, int);
    if (!real) {
        *(void **) (&real) = fn("cublasGemmBatchedEx");
    }
    return real(h, ta, tb, m, n, k, alpha, A, at, lda, B, bt, ldb, beta, C, ct, ldc, batch, compute, algo(a));
}

status_t cublasGemmStridedBatchedEx(handle_t h, int ta, int tb, int m, int n, int k, const void * alpha,
                                    const void * A, int at, int lda, long long sa, const void * B, int bt, int ldb,
                                    long long sb, const void * beta, void * C, int ct, int ldc, long long sc,
                                    int batch, int compute, int a) {
    static status_t (*real)(handle_t, int, int, int, int, int, const void *, const void *, int, int, long long,
                            const void *, int, int, long long, const void *, void *, int, int, long long, int, int,
                            int);
    if (!real) {
        *(void **) (&real) = fn("cublasGemmStridedBatchedEx");
    }
    return real(h, ta, tb, m, n, k, alpha, A, at, lda, sa, B, bt, ldb, sb, beta, C, ct, ldc, sc, batch, compute,
                algo(a));
}

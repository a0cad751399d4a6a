/* A libcuda.so.1 for a machine without an NVIDIA driver: the wheel's libggml-cuda.so.0 names libcuda.so.1 as a
 * dependency, so the loader needs one before the CPU backend can run at all. Every entry point answers
 * CUDA_ERROR_NO_DEVICE (100); the CUDA 12 runtime finds no driver API behind it and reports no device, and ggml
 * then registers no CUDA device and runs on the CPU. Only for the CPU check of benchmarks.qwentts_cpp; never on a
 * GPU box, where the driver's own libcuda.so.1 must be used.
 *
 * Build: cc -shared -fPIC -O2 -o libcuda.so.1 cuda_stub.c -Wl,-soname,libcuda.so.1
 */
#define NO_DEVICE 100

#define STUB(name) \
    int name(void) { return NO_DEVICE; }

STUB(cuInit)
STUB(cuDriverGetVersion)
STUB(cuDeviceGet)
STUB(cuDeviceGetCount)
STUB(cuDeviceGetAttribute)
STUB(cuMemCreate)
STUB(cuMemAddressReserve)
STUB(cuMemAddressFree)
STUB(cuMemMap)
STUB(cuMemUnmap)
STUB(cuMemRelease)
STUB(cuMemSetAccess)
STUB(cuMemGetAllocationGranularity)

int cuGetErrorString(int error, const char ** text) {
    (void) error;
    *text = "no CUDA driver (stub libcuda.so.1)";
    return 0;
}

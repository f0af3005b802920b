/* Driver calls of the gpu-check programs that the fake driver (tests/cuda/fake_libcuda*.c)
 * lacks, for gpu_check.sh --fake only. This object depends on the fake driver, so
 * MEMTRACE_LIBCUDA names it: a dlsym on its handle (the drop-in's, the fake runtime's)
 * also searches the fake driver.
 * - cuMemsetD8_v2: cuMemsetD8Async on the legacy stream, then that stream's sync. */
#include <cuda.h>

#define EX_API __attribute__((visibility("default")))

EX_API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    CUresult r = cuMemsetD8Async(d, v, n, NULL);
    return r != CUDA_SUCCESS ? r : cuStreamSynchronize(NULL);
}

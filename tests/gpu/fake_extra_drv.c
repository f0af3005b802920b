/* Driver calls of the gpu-check programs that the fake driver (tests/cuda/fake_libcuda*.c)
 * lacks, for gpu_check.sh --fake only. This object depends on the fake driver, so
 * MEMTRACE_LIBCUDA names it: a dlsym on its handle (the drop-in's, the fake runtime's)
 * also searches the fake driver.
 * - cuMemsetD8_v2: cuMemsetD8Async on the legacy stream, then that stream's sync.
 * - cuCtxCreate_v4: the fake driver has primary contexts only, so it answers
 *   CUDA_ERROR_NOT_SUPPORTED and check 10 says that part did not run. */
#include <cuda.h>

#define EX_API __attribute__((visibility("default")))

EX_API CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n)
{
    CUresult r = cuMemsetD8Async(d, v, n, NULL);
    return r != CUDA_SUCCESS ? r : cuStreamSynchronize(NULL);
}

EX_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned flags,
                               CUdevice dev)
{
    (void)params;
    (void)flags;
    (void)dev;
    *pctx = NULL;
    return CUDA_ERROR_NOT_SUPPORTED;
}

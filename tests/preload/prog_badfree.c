/* Frees a pointer it never allocated, then a device pointer twice. Exit 0 iff both get
 * cudaErrorInvalidValue (what the CUDA runtime returns) and the process lives on. */
#include <stdio.h>

#include <cuda_runtime_api.h>

int main(void)
{
    static int not_device;
    cudaError_t e = cudaFree(&not_device);
    if (e != cudaErrorInvalidValue) {
        fprintf(stderr, "cudaFree(host pointer) returned %d\n", (int)e);
        return 1;
    }
    if (cudaGetLastError() != cudaErrorInvalidValue || cudaGetLastError() != cudaSuccess) {
        fprintf(stderr, "cudaGetLastError does not report then clear the error\n");
        return 1;
    }
    void *p = NULL;
    if (cudaMalloc(&p, 1000) != cudaSuccess || cudaFree(p) != cudaSuccess)
        return 1;
    e = cudaFree(p);
    if (e != cudaErrorInvalidValue) {
        fprintf(stderr, "double cudaFree returned %d\n", (int)e);
        return 1;
    }
    printf("ok: unknown frees rejected with %s\n", cudaGetErrorName(e));
    return 0;
}

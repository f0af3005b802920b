/* Allocates 64 MiB blocks until cudaMalloc fails, as a program sized for a bigger device
 * would. Exits 3 with the CUDA error message on the out-of-memory failure; 0 never. */
#include <stdio.h>

#include <cuda_runtime_api.h>

int main(void)
{
    for (int i = 0; i < 4096; i++) {
        void *p = NULL;
        cudaError_t e = cudaMalloc(&p, (size_t)64 << 20);
        if (e != cudaSuccess) {
            fprintf(stderr, "cudaMalloc #%d: %s (%s)\n", i, cudaGetErrorString(e),
                    cudaGetErrorName(e));
            return e == cudaErrorMemoryAllocation ? 3 : 1;
        }
    }
    return 0;
}

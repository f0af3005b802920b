/* Check 2, the plugin (finding N1): linked to libcudart and dlopen'ed RTLD_LOCAL by
 * check2_main, so the runtime is only in a local scope. */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

__attribute__((visibility("default"))) int plugin_run(void)
{
    enum { N = 4096 };
    static unsigned char in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (unsigned char)(i * 7 + 1);
    void *d = NULL;
    cudaError_t s = cudaSetDevice(0);
    cudaError_t m = cudaMalloc(&d, N);
    cudaError_t h = cudaMemcpy(d, in, N, cudaMemcpyHostToDevice);
    cudaError_t b = cudaMemcpy(out, d, N, cudaMemcpyDeviceToHost);
    int same = memcmp(in, out, N) == 0;
    cudaError_t f = cudaFree(d);
    printf("plugin: cudaSetDevice=%d cudaMalloc=%d H2D=%d D2H=%d bytes=%s cudaFree=%d\n", s, m, h,
           b, same ? "same" : "differ", f);
    return s || m || h || b || !same || f;
}

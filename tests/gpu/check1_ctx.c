/* Check 1 (finding N2): cudaFree(0) and cudaMalloc must leave a current context, as the
 * runtime's own calls do; PyTorch's jiterator calls the driver right after them. */
#include <pthread.h>
#include <stdio.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

static int bad;

static void *fresh_thread(void *arg)
{
    (void)arg;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, 1 << 20);
    CUcontext c = NULL;
    CUresult r = cuCtxGetCurrent(&c);
    printf("thread: cudaMalloc=%d cuCtxGetCurrent=%d ctx=%s\n", e, r, c ? "set" : "NULL");
    CUresult m = cuMemsetD8((CUdeviceptr)p, 0, 1 << 20);
    printf("thread: cuMemsetD8=%d\n", m);
    cudaError_t f = cudaFree(p);
    printf("thread: cudaFree=%d\n", f);
    bad |=
        e != cudaSuccess || r != CUDA_SUCCESS || c == NULL || m != CUDA_SUCCESS || f != cudaSuccess;
    return NULL;
}

int main(void)
{
    cudaError_t e = cudaFree(0);
    CUcontext c = NULL;
    CUresult r = cuCtxGetCurrent(&c);
    printf("main: cudaFree(0)=%d cuCtxGetCurrent=%d ctx=%s\n", e, r, c ? "set" : "NULL");
    bad |= e != cudaSuccess || r != CUDA_SUCCESS || c == NULL;
    pthread_t t;
    if (pthread_create(&t, NULL, fresh_thread, NULL) != 0)
        return 2;
    pthread_join(t, NULL);
    printf("%s\n", bad ? "FAIL: no usable current context" : "ok");
    return bad;
}

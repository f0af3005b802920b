/* Check 9 (finding N9): cudaFree of cudaMallocAsync memory, and cuMemFree_v2 of
 * cuMemAllocAsync memory, must not wait for the device. Another stream is held busy by a
 * host function that waits for a watchdog thread, as a stream that waits on host
 * progress (NCCL, a spin kernel) does; a device-wide sync in the free waits with it.
 * Over the fake driver (it exports fake_cuda_count, and its own frees always wait), the
 * check counts the cuCtxSynchronize calls the frees make instead of timing them. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

enum { HOLD_MS = 3000, SLOW_MS = 1000 };

static atomic_int flag;
static size_t (*fake_count)(const char *name);

static void CUDA_CB spin(void *arg)
{
    (void)arg;
    while (!atomic_load(&flag))
        usleep(1000);
}

static void *watchdog(void *arg)
{
    (void)arg;
    usleep(HOLD_MS * 1000);
    atomic_store(&flag, 1);
    return NULL;
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

/* Runs free_one with the device held busy (real driver) and says whether it waited. */
static int waited(CUresult (*free_one)(void *), void *arg, CUresult *res, CUstream busy)
{
    if (fake_count != NULL) {
        size_t n0 = fake_count("cuCtxSynchronize");
        *res = free_one(arg);
        size_t n = fake_count("cuCtxSynchronize") - n0;
        fprintf(stderr, "%zu cuCtxSynchronize calls\n", n);
        return n > 0;
    }
    atomic_store(&flag, 0);
    CUresult h = cuLaunchHostFunc(busy, spin, NULL);
    pthread_t w;
    if (h != CUDA_SUCCESS || pthread_create(&w, NULL, watchdog, NULL) != 0) {
        *res = h != CUDA_SUCCESS ? h : CUDA_ERROR_UNKNOWN;
        return 1;
    }
    double t0 = now_ms();
    *res = free_one(arg);
    double ms = now_ms() - t0;
    pthread_join(w, NULL);
    CUresult z = cuStreamSynchronize(busy);
    fprintf(stderr, "free took %.0f ms with the device held %d ms\n", ms, HOLD_MS);
    if (*res == CUDA_SUCCESS)
        *res = z;
    return ms >= SLOW_MS;
}

static CUresult rt_free(void *p)
{
    return (CUresult)cudaFree(p);
}

static CUresult drv_free(void *p)
{
    return cuMemFree_v2((CUdeviceptr)p);
}

int main(void)
{
    *(void **)&fake_count = dlsym(RTLD_DEFAULT, "fake_cuda_count");
    cudaStream_t s1 = NULL;
    CUstream busy = NULL;
    void *p = NULL;
    CUdeviceptr d = 0;
    cudaError_t e1 = cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    cudaError_t e2 = cudaMallocAsync(&p, 1 << 20, s1);
    cudaError_t e3 = cudaStreamSynchronize(s1);
    CUresult r1 = cuMemAllocAsync(&d, 1 << 20, (CUstream)s1);
    CUresult r2 = cuStreamSynchronize((CUstream)s1);
    CUresult r3 = cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING);
    printf("setup: %d %d %d %d %d %d\n", e1, e2, e3, r1, r2, r3);
    CUresult f, g;
    int slow1 = waited(rt_free, p, &f, busy);
    int slow2 = waited(drv_free, (void *)d, &g, busy);
    printf("cudaFree(async)=%d %s\n", f, slow1 ? "waited for the device" : "did not wait");
    printf("cuMemFree_v2(async)=%d %s\n", g, slow2 ? "waited for the device" : "did not wait");
    cuStreamDestroy(busy);
    cudaStreamDestroy(s1);
    int bad = e1 || e2 || e3 || r1 || r2 || r3 || f || g || slow1 || slow2;
    printf("%s\n", bad ? "FAIL: a free of stream-ordered memory synchronised the device" : "ok");
    return bad;
}

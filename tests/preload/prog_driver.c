/* A driver-API program that finds its entry points the way the CUDA runtime does:
 * dlopen("libcuda.so.1"), dlsym "cuGetProcAddress_v2" (else the 11.x "cuGetProcAddress"),
 * then every function by base name and CUDA version. Never modified for memtrace.
 * Exit 0 iff allocation, copies both ways and free work and the data is right.
 * With argument "devices": 1 MiB on device 0, then device 1's primary context pushed, 2 MiB
 * on it and each device's cuMemGetInfo printed, popped back to device 0. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>

typedef CUresult (*getproc2_t)(const char *, void **, int, cuuint64_t,
                               CUdriverProcAddressQueryResult *);
typedef CUresult (*getproc1_t)(const char *, void **, int, cuuint64_t);

static getproc2_t gp2;
static getproc1_t gp1;

static void *get(const char *name)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    CUresult r = gp2 ? gp2(name, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st)
                     : gp1(name, &fn, 11030, CU_GET_PROC_ADDRESS_DEFAULT);
    if (r != CUDA_SUCCESS || fn == NULL) {
        fprintf(stderr, "cuGetProcAddress(%s) failed: %d\n", name, (int)r);
        exit(1);
    }
    return fn;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        CUresult r_ = (call);                                                                      \
        if (r_ != CUDA_SUCCESS) {                                                                  \
            fprintf(stderr, "%s failed: %d\n", #call, (int)r_);                                    \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

int main(int argc, char **argv)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "no libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    int use_v1 = argc > 1 && strcmp(argv[1], "v1") == 0;
    if (!use_v1)
        gp2 = (getproc2_t)dlsym(lib, "cuGetProcAddress_v2");
    if (gp2 == NULL)
        gp1 = (getproc1_t)dlsym(lib, "cuGetProcAddress");
    if (gp2 == NULL && gp1 == NULL) {
        fprintf(stderr, "no cuGetProcAddress in libcuda.so.1\n");
        return 1;
    }
    CUresult (*init)(unsigned) = get("cuInit");
    CUresult (*devget)(CUdevice *, int) = get("cuDeviceGet");
    CUresult (*retain)(CUcontext *, CUdevice) = get("cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(CUcontext) = get("cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) = get("cuMemAlloc");
    CUresult (*dfree)(CUdeviceptr) = get("cuMemFree");
    CUresult (*htod)(CUdeviceptr, const void *, size_t) = get("cuMemcpyHtoD");
    CUresult (*dtoh)(void *, CUdeviceptr, size_t) = get("cuMemcpyDtoH");
    CUresult (*memset8)(CUdeviceptr, unsigned char, size_t) = get("cuMemsetD8");

    CUdevice dev;
    CUcontext ctx;
    CHECK(init(0));
    CHECK(devget(&dev, 0));
    CHECK(retain(&ctx, dev));
    CHECK(setcur(ctx));
    if (argc > 1 && strcmp(argv[1], "devices") == 0) {
        CUresult (*push)(CUcontext) = get("cuCtxPushCurrent");
        CUresult (*pop)(CUcontext *) = get("cuCtxPopCurrent");
        CUresult (*getdev)(CUdevice *) = get("cuCtxGetDevice");
        CUresult (*info)(size_t *, size_t *) = get("cuMemGetInfo");
        CUdevice d1, now;
        CUcontext ctx1, popped;
        CUdeviceptr a, b;
        size_t fr[2], tot[2];
        CHECK(alloc(&a, 1 << 20));
        CHECK(devget(&d1, 1));
        CHECK(retain(&ctx1, d1));
        CHECK(push(ctx1));
        CHECK(getdev(&now));
        CHECK(alloc(&b, 2 << 20));
        CHECK(info(&fr[1], &tot[1]));
        CHECK(pop(&popped));
        CUdevice after;
        CHECK(getdev(&after));
        CHECK(info(&fr[0], &tot[0]));
        if (now != 1 || after != 0 || popped != ctx1) {
            fprintf(stderr, "pushed device %d, after the pop %d\n", (int)now, (int)after);
            return 1;
        }
        printf("dev0: free=%zu total=%zu\ndev1: free=%zu total=%zu\n", fr[0], tot[0], fr[1],
               tot[1]);
        CHECK(dfree(a));
        CHECK(dfree(b));
        printf("ok: pushed and popped\n");
        return 0;
    }
    enum { N = 300000, K = 5 };
    unsigned char *h = malloc(N), *back = malloc(N);
    for (int i = 0; i < N; i++)
        h[i] = (unsigned char)(i ^ (i >> 8));
    CUdeviceptr d[K];
    for (int k = 0; k < K; k++) {
        CHECK(alloc(&d[k], N + k * 4096));
        CHECK(htod(d[k], h, N));
        CHECK(memset8(d[k] + k, (unsigned char)(0xA0 + k), 1));
    }
    for (int k = 0; k < K; k++) {
        CHECK(dtoh(back, d[k], N));
        for (int i = 0; i < N; i++) {
            unsigned char want = i == k ? (unsigned char)(0xA0 + k) : h[i];
            if (back[i] != want) {
                fprintf(stderr, "buffer %d byte %d is %u, want %u\n", k, i, back[i], want);
                return 1;
            }
        }
        CHECK(dfree(d[k]));
    }
    /* a pointer never handed out: the driver's answer, not a crash */
    CUresult bad = dfree((CUdeviceptr)(uintptr_t)h);
    if (bad != CUDA_ERROR_INVALID_VALUE) {
        fprintf(stderr, "cuMemFree(unknown) returned %d\n", (int)bad);
        return 1;
    }
    free(h);
    free(back);
    printf("ok: %d device allocations through cuGetProcAddress%s\n", K, gp2 ? "_v2" : "");
    return 0;
}

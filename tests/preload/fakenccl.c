/* A library that takes device memory as NCCL does: not through cudaMalloc but from the
 * driver, whose entry points it finds with cuGetProcAddress (NCCL's static runtime does
 * the same). The drop-in must name it, libfakenccl.so, as the owner of that memory. */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#define FAKENCCL_API __attribute__((visibility("default")))

FAKENCCL_API int fakenccl_alloc(size_t width, size_t height, void **out);
FAKENCCL_API int fakenccl_free(void *p);
FAKENCCL_API int fakenccl_create(int device, size_t size, unsigned long long *handle);
FAKENCCL_API int fakenccl_release(unsigned long long handle);
FAKENCCL_API int fakenccl_runtime_pitch(size_t width, size_t height, void **out);

typedef CUresult (*getproc_t)(const char *, void **, int, cuuint64_t,
                              CUdriverProcAddressQueryResult *);

/* The driver's entry point for base name, as NCCL asks for it; NULL if none. */
static void *proc(const char *base)
{
    getproc_t gp = (getproc_t)dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2");
    void *fn = NULL;
    CUdriverProcAddressQueryResult st;
    if (gp == NULL || gp(base, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS)
        return NULL;
    return fn;
}

/* A pitched buffer of height rows of width bytes: cuMemAllocPitch's CUresult. */
int fakenccl_alloc(size_t width, size_t height, void **out)
{
    CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned) =
        (CUresult(*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))proc("cuMemAllocPitch");
    if (pitch == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUdeviceptr d = 0;
    size_t p = 0;
    CUresult r = pitch(&d, &p, width, height, 16);
    *out = (void *)(uintptr_t)d;
    return (int)r;
}

int fakenccl_free(void *p)
{
    CUresult (*fr)(CUdeviceptr) = (CUresult(*)(CUdeviceptr))proc("cuMemFree");
    return fr != NULL ? (int)fr((CUdeviceptr)(uintptr_t)p) : CUDA_ERROR_NOT_FOUND;
}

/* Physical memory on device, as NCCL's cuMem buffers: cuMemCreate's CUresult. */
int fakenccl_create(int device, size_t size, unsigned long long *handle)
{
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long) =
        (CUresult(*)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long))proc("cuMemCreate");
    if (create == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = device}};
    CUmemGenericAllocationHandle h = 0;
    CUresult r = create(&h, size, &prop, 0);
    *handle = h;
    return (int)r;
}

int fakenccl_release(unsigned long long handle)
{
    CUresult (*rel)(CUmemGenericAllocationHandle) =
        (CUresult(*)(CUmemGenericAllocationHandle))proc("cuMemRelease");
    return rel != NULL ? (int)rel(handle) : CUDA_ERROR_NOT_FOUND;
}

/* Pitched memory through an entry point of the shared runtime that the drop-in does not
 * hook (the fake runtime's fakert_static_malloc_pitch): the runtime is the driver hook's
 * caller, and this library the runtime's. cudaError_t, or -1 without that runtime. */
int fakenccl_runtime_pitch(size_t width, size_t height, void **out)
{
    int (*rt)(void **, size_t *, size_t, size_t) =
        (int (*)(void **, size_t *, size_t, size_t))dlsym(RTLD_DEFAULT,
                                                          "fakert_static_malloc_pitch");
    if (rt == NULL)
        return -1;
    size_t pitch = 0;
    int e = rt(out, &pitch, width, height);
    /* Not a tail call: this frame stays on the stack, as a real caller's would. */
    return e != 0 || pitch < width ? (e != 0 ? e : -1) : 0;
}

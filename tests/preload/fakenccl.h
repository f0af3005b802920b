/* libfakenccl.so (fakenccl.c): device memory taken from the driver, as NCCL takes it.
 * Each returns the driver's CUresult. */
#ifndef MT_TESTS_PRELOAD_FAKENCCL_H
#define MT_TESTS_PRELOAD_FAKENCCL_H

#include <stddef.h>

int fakenccl_alloc(size_t width, size_t height, void **out); /* cuMemAllocPitch, 16-byte elems */
int fakenccl_free(void *p);                                  /* cuMemFree */
int fakenccl_create(int device, size_t size, unsigned long long *handle); /* cuMemCreate */
int fakenccl_release(unsigned long long handle);                          /* cuMemRelease */
/* Pitched memory through the fake runtime's unhooked fakert_static_malloc_pitch (cuda-mode
 * tests only): its cudaError_t, or -1 without that runtime. */
int fakenccl_runtime_pitch(size_t width, size_t height, void **out);

#endif

/* The runtime entry points prog_local.c calls, as a plugin or a ctypes-style loader gets
 * them (plugin_local.c). */
#ifndef MT_TESTS_PRELOAD_PROG_LOCAL_H
#define MT_TESTS_PRELOAD_PROG_LOCAL_H

#include <cuda_runtime_api.h>

typedef struct local_rt_s {
    cudaError_t (*set_device)(int);
    cudaError_t (*malloc)(void **, size_t);
    cudaError_t (*memcpy)(void *, const void *, size_t, enum cudaMemcpyKind);
    cudaError_t (*get_last_error)(void);
    cudaError_t (*free)(void *);
} local_rt_t;

/* plugin_local.so's one export: the entry points its own calls bind to. */
void plugin_table(local_rt_t *rt);

#endif

/* A plugin linked to the CUDA runtime (the fake), dlopen'ed RTLD_LOCAL by prog_local.c as
 * Python extensions and plugin loaders do: the runtime is then in the plugin's local
 * scope only, and dlsym(RTLD_NEXT) from the drop-in cannot see it. It hands out the
 * entry points its own calls would bind to. */
#include <cuda_runtime_api.h>

#include "tests/preload/prog_local.h"

__attribute__((visibility("default"))) void plugin_table(local_rt_t *rt)
{
    rt->set_device = cudaSetDevice;
    rt->malloc = cudaMalloc;
    rt->memcpy = cudaMemcpy;
    rt->get_last_error = cudaGetLastError;
    rt->free = cudaFree;
}

/* A program that reaches the CUDA runtime only through a local scope, run with and
 * without the drop-in by test_preload_cuda.c. Never linked to the runtime itself:
 *   prog_local plugin PLUGIN.so   dlopen(PLUGIN, RTLD_LOCAL), the plugin linked to it;
 *   prog_local direct RUNTIME.so  dlopen(RUNTIME, RTLD_LOCAL) and dlsym, as ctypes does.
 * Either way it sets the device, allocates, copies host to device and back, copies with
 * an invalid kind and reads the last error. Exit 0 iff every code is the runtime's own. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "tests/preload/prog_local.h"

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);               \
            return 1;                                                                              \
        }                                                                                          \
    } while (0)

static int sequence(const local_rt_t *rt)
{
    enum { N = 4096 };
    static unsigned char in[N], out[N];
    for (int i = 0; i < N; i++)
        in[i] = (unsigned char)(i * 7 + 1);
    void *d = NULL;
    int s = rt->set_device(0);
    int m = rt->malloc(&d, N);
    int h = rt->memcpy(d, in, N, cudaMemcpyHostToDevice);
    int b = rt->memcpy(out, d, N, cudaMemcpyDeviceToHost);
    int k = rt->memcpy(out, in, 1, (enum cudaMemcpyKind)99);
    int last = rt->get_last_error();
    int again = rt->get_last_error();
    int f = rt->free(d);
    printf("cudaSetDevice=%d cudaMalloc=%d H2D=%d D2H=%d bytes=%s kind99=%d last=%d again=%d "
           "cudaFree=%d\n",
           s, m, h, b, memcmp(in, out, N) == 0 ? "same" : "differ", k, last, again, f);
    CHECK(s == cudaSuccess && m == cudaSuccess && d != NULL);
    CHECK(h == cudaSuccess && b == cudaSuccess);
    CHECK(memcmp(in, out, N) == 0);
    CHECK(k == cudaErrorInvalidMemcpyDirection);
    CHECK(last == cudaErrorInvalidMemcpyDirection);
    CHECK(again == cudaSuccess);
    CHECK(f == cudaSuccess);
    return 0;
}

#define SYM(field, name) CHECK((*(void **)&rt.field = dlsym(h, name)) != NULL)

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "plugin") != 0 && strcmp(argv[1], "direct") != 0)) {
        fprintf(stderr, "usage: prog_local plugin|direct LIB.so\n");
        return 2;
    }
    void *h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    local_rt_t rt = {0};
    if (strcmp(argv[1], "plugin") == 0) {
        void (*table)(local_rt_t *) = (void (*)(local_rt_t *))dlsym(h, "plugin_table");
        CHECK(table != NULL);
        table(&rt);
    } else {
        SYM(set_device, "cudaSetDevice");
        SYM(malloc, "cudaMalloc");
        SYM(memcpy, "cudaMemcpy");
        SYM(get_last_error, "cudaGetLastError");
        SYM(free, "cudaFree");
    }
    return sequence(&rt);
}

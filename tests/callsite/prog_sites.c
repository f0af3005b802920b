/* An unmodified CUDA runtime program for the call-site tests (test_callsite_e2e.py): each
 * allocation comes from a function of its own, so that `memtrace report --by callsite`
 * must name them. load_weights keeps 8 MiB to the end (never freed), make_activations
 * takes 4 MiB a step and frees them, grow_history keeps 256 KiB more each iteration.
 * Built with debug info, and again stripped. */
#include <stdio.h>

#include <cuda_runtime_api.h>

#define STEPS 8

void *load_weights(void);
void *make_activations(void);
void *grow_history(int step);
int train_step(int step);

static void *history[STEPS];

__attribute__((noinline)) void *load_weights(void)
{
    void *p = NULL;
    return cudaMalloc(&p, 8u << 20) == cudaSuccess ? p : NULL;
}

__attribute__((noinline)) void *make_activations(void)
{
    void *p = NULL;
    return cudaMalloc(&p, 4u << 20) == cudaSuccess ? p : NULL;
}

__attribute__((noinline)) void *grow_history(int step)
{
    void *p = NULL;
    history[step] = cudaMalloc(&p, 256u << 10) == cudaSuccess ? p : NULL;
    return history[step];
}

__attribute__((noinline)) int train_step(int step)
{
    void *act = make_activations();
    void *h = grow_history(step);
    int ok = act != NULL && h != NULL;
    cudaFree(act);
    return ok;
}

int main(void)
{
    void *w = load_weights();
    int ok = w != NULL;
    for (int s = 0; s < STEPS; s++)
        ok &= train_step(s);
    cudaDeviceSynchronize();
    printf("%s\n", ok ? "ok" : "failed");
    return ok ? 0 : 1;
}

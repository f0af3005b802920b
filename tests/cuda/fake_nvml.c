/* A fake libnvidia-ml.so.1: the three calls the cuda backend makes (backend/cuda_nvml.c), with
 * nvml.h's ABI. Each device (by the fake driver's bus id, "00000000:<ordinal + 1>:00.0")
 * lists FAKE_NVML_OTHERS other processes of 1 MiB each, then this one with FAKE_NVML_SELF
 * bytes; FAKE_NVML_HIDE_SELF=1 leaves this process out (a pid namespace NVML does not see
 * into). Read at each call, so a test may change them between calls. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef struct proc_s {
    unsigned int pid;
    unsigned long long used;
    unsigned int gpu_instance, compute_instance;
} proc_t;

API int nvmlInit_v2(void);
API int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev);
API int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned int *n, proc_t *out);

static unsigned long env_ul(const char *name, unsigned long def)
{
    const char *v = getenv(name);
    return v != NULL && *v != '\0' ? strtoul(v, NULL, 10) : def;
}

API int nvmlInit_v2(void)
{
    return 0;
}

API int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **dev)
{
    unsigned d = 0;
    if (bus == NULL || sscanf(bus, "00000000:%x:00.0", &d) != 1 || d == 0)
        return 2; /* NVML_ERROR_INVALID_ARGUMENT */
    *dev = (void *)(unsigned long)d;
    return 0;
}

API int nvmlDeviceGetComputeRunningProcesses_v3(void *dev, unsigned int *n, proc_t *out)
{
    (void)dev;
    unsigned long others = env_ul("FAKE_NVML_OTHERS", 0);
    int hide = (int)env_ul("FAKE_NVML_HIDE_SELF", 0);
    unsigned int need = (unsigned int)others + (hide ? 0u : 1u);
    if (*n < need) {
        *n = need;
        return 7; /* NVML_ERROR_INSUFFICIENT_SIZE */
    }
    for (unsigned int i = 0; i < others; i++)
        out[i] = (proc_t){.pid = 1000000u + i, .used = 1u << 20};
    if (!hide)
        out[others] = (proc_t){.pid = (unsigned int)getpid(), .used = env_ul("FAKE_NVML_SELF", 0)};
    *n = need;
    return 0;
}

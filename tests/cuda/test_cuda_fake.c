/* The fake driver itself (fake_libcuda.c) refuses what a real driver refuses, so that the
 * backend's tests on it mean something: no current context, a stream or event used under
 * another context, a CUDA call from a host function, VMM misuse; and it orders work as a
 * GPU does: each stream its own queue, streams concurrent, cuStreamWaitEvent ordering. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>

#include "tests/cuda/fake_ctl.h"

#define MiB ((size_t)1 << 20)

static struct {
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*Push)(CUcontext);
    CUresult (*Pop)(CUcontext *);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*StreamCreate)(CUstream *, unsigned);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned);
    CUresult (*LaunchHostFunc)(CUstream, CUhostFn, void *);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*AddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*AddressFree)(CUdeviceptr, size_t);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
} cu;

static CUcontext ctx0, ctx1;

static int setup(void **state)
{
    if (fake_ctl_open(state) != 0)
        return -1;
    const char *names[] = {"cuDevicePrimaryCtxRetain",
                           "cuCtxPushCurrent_v2",
                           "cuCtxPopCurrent_v2",
                           "cuMemAlloc_v2",
                           "cuMemFree_v2",
                           "cuStreamCreate",
                           "cuStreamDestroy_v2",
                           "cuStreamSynchronize",
                           "cuStreamWaitEvent",
                           "cuLaunchHostFunc",
                           "cuMemsetD8Async",
                           "cuEventCreate",
                           "cuEventDestroy_v2",
                           "cuEventRecord",
                           "cuEventQuery",
                           "cuEventElapsedTime_v2",
                           "cuEventSynchronize",
                           "cuMemAddressReserve",
                           "cuMemAddressFree",
                           "cuMemCreate",
                           "cuMemRelease",
                           "cuMemMap",
                           "cuMemUnmap",
                           "cuMemSetAccess"};
    void **slots = (void **)&cu;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if ((slots[i] = dlsym(fk.lib, names[i])) == NULL)
            return -1;
    fk.reset(64 * MiB, 2);
    if (cu.PrimaryCtxRetain(&ctx0, 0) != CUDA_SUCCESS ||
        cu.PrimaryCtxRetain(&ctx1, 1) != CUDA_SUCCESS)
        return -1;
    return 0;
}

/* Waits for a semaphore at most 2 s; false on timeout (a schedule that never runs it). */
static bool sem_wait_2s(sem_t *s)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += 2;
    while (sem_timedwait(s, &t) != 0)
        if (errno != EINTR)
            return false;
    return true;
}

static void *alloc_without_ctx(void *arg)
{
    CUdeviceptr p;
    *(CUresult *)arg = cu.MemAlloc(&p, 4096);
    return NULL;
}

static void test_context_required_per_thread(void **state)
{
    (void)state;
    CUdeviceptr p = 0;
    CUstream s;
    CUevent ev;
    assert_int_equal(cu.MemAlloc(&p, 4096), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.StreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.EventCreate(&ev, 0), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext popped;
    assert_int_equal(cu.Pop(&popped), CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.Push((CUcontext)&p), CUDA_ERROR_INVALID_CONTEXT);

    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.MemAlloc(&p, 4096), CUDA_SUCCESS);
    /* the stack is the calling thread's: another thread still has none */
    CUresult other = CUDA_SUCCESS;
    pthread_t t;
    pthread_create(&t, NULL, alloc_without_ctx, &other);
    pthread_join(t, NULL);
    assert_int_equal(other, CUDA_ERROR_INVALID_CONTEXT);
    assert_int_equal(cu.MemFree(p), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
    assert_ptr_equal(popped, ctx0);
}

static void test_streams_events_tied_to_context(void **state)
{
    (void)state;
    CUstream s0;
    CUevent e0, e1;
    CUcontext popped;
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.StreamCreate(&s0, 0), CUDA_SUCCESS);
    assert_int_equal(cu.EventCreate(&e0, 0), CUDA_SUCCESS);
    assert_int_equal(cu.Push(ctx1), CUDA_SUCCESS);
    assert_int_equal(cu.EventCreate(&e1, 0), CUDA_SUCCESS);
    assert_int_equal(cu.StreamSynchronize(s0), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cu.EventRecord(e0, NULL), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cu.EventRecord(e1, NULL), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
    assert_int_equal(cu.EventRecord(e1, s0), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cu.StreamWaitEvent(s0, e1, 0), CUDA_SUCCESS); /* cross-context wait: legal */
    assert_int_equal(cu.StreamSynchronize(s0), CUDA_SUCCESS);
    assert_int_equal(cu.StreamDestroy(s0), CUDA_SUCCESS);
    assert_int_equal(cu.StreamSynchronize(s0), CUDA_ERROR_INVALID_HANDLE); /* destroyed */
    assert_int_equal(cu.EventDestroy(e0), CUDA_SUCCESS);
    assert_int_equal(cu.EventQuery(e0), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cu.Push(ctx1), CUDA_SUCCESS);
    assert_int_equal(cu.EventDestroy(e1), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
}

static void post_fn(void *sem)
{
    sem_post(sem);
}

typedef struct wait_s {
    sem_t *sem;
    bool ok;
} wait_t;

static void wait_fn(void *ud)
{
    wait_t *w = ud;
    w->ok = sem_wait_2s(w->sem);
}

/* s1 blocks until s2 runs: with one global FIFO this never completes. */
static void test_streams_run_concurrently(void **state)
{
    (void)state;
    CUstream s1, s2;
    CUcontext popped;
    sem_t sem;
    sem_init(&sem, 0, 0);
    wait_t w = {&sem, false};
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.StreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu.LaunchHostFunc(s1, wait_fn, &w), CUDA_SUCCESS);
    assert_int_equal(cu.LaunchHostFunc(s2, post_fn, &sem), CUDA_SUCCESS);
    assert_int_equal(cu.StreamSynchronize(s1), CUDA_SUCCESS);
    assert_true(w.ok);
    assert_int_equal(cu.StreamDestroy(s1), CUDA_SUCCESS);
    assert_int_equal(cu.StreamDestroy(s2), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
    sem_destroy(&sem);
}

/* s2's memset waits for the event recorded on s1 behind a closed gate. */
static void test_wait_event_orders_streams(void **state)
{
    (void)state;
    CUstream s1, s2;
    CUevent ev, done;
    CUcontext popped;
    sem_t gate;
    sem_init(&gate, 0, 0);
    wait_t w = {&gate, false};
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    CUdeviceptr d;
    assert_int_equal(cu.MemAlloc(&d, 4096), CUDA_SUCCESS);
    assert_int_equal(cu.StreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu.EventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cu.EventCreate(&done, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    assert_int_equal(cu.LaunchHostFunc(s1, wait_fn, &w), CUDA_SUCCESS);
    assert_int_equal(cu.EventRecord(ev, s1), CUDA_SUCCESS);
    assert_int_equal(cu.StreamWaitEvent(s2, ev, 0), CUDA_SUCCESS);
    assert_int_equal(cu.MemsetD8Async(d, 0x77, 16, s2), CUDA_SUCCESS);
    assert_int_equal(cu.EventRecord(done, s2), CUDA_SUCCESS);
    struct timespec nap = {0, 20 * 1000 * 1000};
    nanosleep(&nap, NULL);
    assert_int_equal(cu.EventQuery(done), CUDA_ERROR_NOT_READY);
    assert_int_equal(cu.EventQuery(ev), CUDA_ERROR_NOT_READY);
    sem_post(&gate);
    assert_int_equal(cu.EventSynchronize(done), CUDA_SUCCESS);
    assert_true(w.ok);
    assert_int_equal(cu.EventQuery(ev), CUDA_SUCCESS);
    assert_int_equal(((unsigned char *)fk.shadow((void *)(uintptr_t)d))[15], 0x77);
    /* timing disabled: no elapsed time, as the driver */
    float ms;
    assert_int_equal(cu.EventElapsedTime(&ms, ev, done), CUDA_ERROR_INVALID_HANDLE);
    cu.EventDestroy(ev);
    cu.EventDestroy(done);
    cu.StreamDestroy(s1);
    cu.StreamDestroy(s2);
    assert_int_equal(cu.MemFree(d), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
    sem_destroy(&gate);
}

typedef struct cb_s {
    pthread_t caller, ran_on;
    CUresult alloc, push;
} cb_t;

static void calling_back(void *ud)
{
    cb_t *cb = ud;
    cb->ran_on = pthread_self();
    CUdeviceptr p;
    cb->alloc = cu.MemAlloc(&p, 4096);
    cb->push = cu.Push(ctx0);
}

static void test_host_func_later_elsewhere_no_cuda(void **state)
{
    (void)state;
    CUcontext popped;
    cb_t cb = {.caller = pthread_self()};
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    fk.hold(true);
    assert_int_equal(cu.LaunchHostFunc(NULL, calling_back, &cb), CUDA_SUCCESS);
    assert_int_equal(cb.alloc, CUDA_SUCCESS); /* not run yet */
    fk.hold(false);
    assert_int_equal(cu.StreamSynchronize(NULL), CUDA_SUCCESS);
    assert_false(pthread_equal(cb.ran_on, cb.caller));
    assert_int_equal(cb.alloc, CUDA_ERROR_NOT_PERMITTED);
    assert_int_equal(cb.push, CUDA_ERROR_NOT_PERMITTED);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
}

/* A host dereference of device memory faults, as on a GPU; the API reaches its bytes. */
static void test_device_memory_not_host_addressable(void **state)
{
    (void)state;
    CUcontext popped;
    CUdeviceptr d;
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.MemAlloc(&d, 4096), CUDA_SUCCESS);
    assert_int_equal(cu.MemsetD8Async(d, 0x3C, 4096, NULL), CUDA_SUCCESS);
    assert_int_equal(cu.StreamSynchronize(NULL), CUDA_SUCCESS);
    assert_int_equal(((unsigned char *)fk.shadow((void *)(uintptr_t)d))[4095], 0x3C);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* cmocka's handler would report and exit */
        volatile unsigned char *h = (volatile unsigned char *)(uintptr_t)d;
        _exit(h[0] == 0x3C ? 0 : 1); /* must not get here */
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGSEGV);
    assert_int_equal(cu.MemFree(d), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
}

static void test_vmm_strict(void **state)
{
    (void)state;
    const size_t G = 2 * MiB;
    CUcontext popped;
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    CUdeviceptr base;
    assert_int_equal(cu.AddressReserve(&base, 3 * MiB, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.AddressReserve(&base, 4 * G, 0, 0, 0), CUDA_SUCCESS);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle h1, h2;
    assert_int_equal(cu.MemCreate(&h1, G + 4096, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    prop.location.id = 1; /* device 1's granularity is 4 MiB: 2 MiB is refused there */
    assert_int_equal(cu.MemCreate(&h1, G, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.MemCreate(&h1, 2 * G, &prop, 0), CUDA_SUCCESS);
    CUdeviceptr odd = base % (2 * G) == 0 ? base + G : base; /* 2 MiB- not 4 MiB-aligned */
    assert_int_equal(cu.MemMap(odd, 2 * G, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.MemRelease(h1), CUDA_SUCCESS);
    prop.location.id = 0;
    assert_int_equal(cu.MemCreate(&h1, 2 * G, &prop, 0), CUDA_SUCCESS);
    assert_int_equal(cu.MemCreate(&h2, G, &prop, 0), CUDA_SUCCESS);
    /* alignment, inside the reservation, no overlap */
    assert_int_equal(cu.MemMap(base + 4096, 2 * G, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.MemMap(base + 3 * G, 2 * G, 0, h1, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.MemMap(base + 4 * G, G, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.MemMap(base, 2 * G, 0, h1, 0), CUDA_SUCCESS);
    assert_int_equal(cu.MemMap(base + G, G, 0, h2, 0), CUDA_ERROR_ALREADY_MAPPED);
    /* access only over mapped bytes; several descriptors; existing devices only */
    CUmemAccessDesc acc[2];
    memset(acc, 0, sizeof acc);
    acc[0].location = prop.location;
    acc[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    acc[1].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[1].location.id = 1;
    acc[1].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    assert_int_equal(cu.MemSetAccess(base, 3 * G, acc, 1), CUDA_ERROR_INVALID_VALUE);
    acc[1].location.id = 7;
    assert_int_equal(cu.MemSetAccess(base, 2 * G, acc, 2), CUDA_ERROR_INVALID_DEVICE);
    acc[1].location.id = 1;
    assert_int_equal(cu.MemSetAccess(base, 2 * G, acc, 2), CUDA_SUCCESS);
    /* whole mappings only; the reservation goes only when empty */
    assert_int_equal(cu.MemUnmap(base, G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.AddressFree(base, 4 * G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.MemUnmap(base, 2 * G), CUDA_SUCCESS);
    assert_int_equal(cu.AddressFree(base, 2 * G), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.AddressFree(base, 4 * G), CUDA_SUCCESS);
    assert_int_equal(cu.MemRelease(h1), CUDA_SUCCESS);
    assert_int_equal(cu.MemRelease(h2), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context_required_per_thread),
        cmocka_unit_test(test_streams_events_tied_to_context),
        cmocka_unit_test(test_streams_run_concurrently),
        cmocka_unit_test(test_wait_event_orders_streams),
        cmocka_unit_test(test_host_func_later_elsewhere_no_cuda),
        cmocka_unit_test(test_device_memory_not_host_addressable),
        cmocka_unit_test(test_vmm_strict),
    };
    return cmocka_run_group_tests(tests, setup, fake_ctl_close);
}

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
#include "tests/common/test_main.h"

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

/* An event on the legacy stream waits for the work queued before it on a blocking stream
 * (created without CU_STREAM_NON_BLOCKING), not on a non-blocking one. */
static void test_legacy_waits_for_blocking_streams(void **state)
{
    (void)state;
    for (int blocking = 0; blocking < 2; blocking++) {
        CUstream s;
        CUevent ev;
        CUcontext popped;
        sem_t gate;
        sem_init(&gate, 0, 0);
        wait_t w = {&gate, false};
        assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
        assert_int_equal(cu.StreamCreate(&s, blocking ? CU_STREAM_DEFAULT : CU_STREAM_NON_BLOCKING),
                         CUDA_SUCCESS);
        assert_int_equal(cu.EventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
        assert_int_equal(cu.LaunchHostFunc(s, wait_fn, &w), CUDA_SUCCESS);
        assert_int_equal(cu.EventRecord(ev, CU_STREAM_LEGACY), CUDA_SUCCESS);
        struct timespec nap = {0, 20 * 1000 * 1000};
        nanosleep(&nap, NULL);
        assert_int_equal(cu.EventQuery(ev), blocking ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
        sem_post(&gate);
        assert_int_equal(cu.EventSynchronize(ev), CUDA_SUCCESS);
        assert_int_equal(cu.StreamSynchronize(s), CUDA_SUCCESS);
        assert_true(w.ok);
        cu.EventDestroy(ev);
        cu.StreamDestroy(s);
        assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
        sem_destroy(&gate);
    }
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

/* ---- what the fake driver does beyond the backend's needs ---- */

typedef CUresult (*gp2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*gp1_t)(const char *, void **, int, cuuint64_t);

/* By base name; the flags pick the _ptsz variant; a missing symbol is a NULL pfn with
 * CUDA_SUCCESS, as documented; versions and flags are checked. */
static void test_get_proc_address_flags(void **state)
{
    (void)state;
    gp2_t gp = (gp2_t)dlsym(fk.lib, "cuGetProcAddress_v2");
    gp1_t gp1 = (gp1_t)dlsym(fk.lib, "cuGetProcAddress");
    assert_non_null(gp);
    assert_non_null(gp1);
    void *f = NULL;
    CUdriverProcAddressQueryResult st;
    assert_int_equal(gp("cuMemAllocAsync", &f, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st),
                     CUDA_SUCCESS);
    assert_ptr_equal(f, dlsym(fk.lib, "cuMemAllocAsync"));
    assert_int_equal(gp("cuMemAllocAsync", &f, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st),
                     CUDA_SUCCESS);
    assert_ptr_equal(f, dlsym(fk.lib, "cuMemAllocAsync"));
    assert_int_equal(
        gp("cuMemAllocAsync", &f, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
        CUDA_SUCCESS);
    assert_ptr_equal(f, dlsym(fk.lib, "cuMemAllocAsync_ptsz"));
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SUCCESS);
    /* synchronous calls have _ptds variants */
    assert_int_equal(
        gp("cuMemcpyHtoD", &f, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
        CUDA_SUCCESS);
    assert_ptr_equal(f, dlsym(fk.lib, "cuMemcpyHtoD_v2_ptds"));
    assert_int_equal(gp("cuMemcpyHtoD", &f, 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &st),
                     CUDA_SUCCESS);
    assert_ptr_equal(f, dlsym(fk.lib, "cuMemcpyHtoD_v2"));
    /* no per-thread variant: the legacy one, whatever the flag */
    assert_int_equal(
        gp("cuMemAlloc", &f, 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
        CUDA_SUCCESS);
    assert_ptr_equal(f, dlsym(fk.lib, "cuMemAlloc_v2"));
    assert_int_equal(gp("cuNoSuchThing", &f, 13000, 0, &st), CUDA_SUCCESS);
    assert_null(f);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    assert_int_equal(gp("cuMemAllocAsync", &f, 11000, 0, &st), CUDA_SUCCESS);
    assert_null(f);
    assert_int_equal(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    assert_int_equal(gp("cuMemAlloc", &f, 13000, 4, &st), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(gp("cuMemAlloc", &f, 13000, 3, &st), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(gp1("cuGetProcAddress", &f, 11030, 0), CUDA_SUCCESS);
    assert_ptr_equal(f, (void *)gp1);
    assert_int_equal(gp1("cuGetProcAddress", &f, 12000, 0), CUDA_SUCCESS);
    assert_ptr_equal(f, (void *)gp);
}

typedef struct {
    CUresult (*launch)(CUstream, CUhostFn, void *);
    sem_t *sem;
    CUresult r;
} pt_arg_t;

static void *post_on_own_stream(void *arg)
{
    pt_arg_t *a = arg;
    CUcontext popped;
    a->r = cu.Push(ctx0);
    if (a->r == CUDA_SUCCESS)
        a->r = a->launch(NULL, post_fn, a->sem); /* _ptsz: NULL is this thread's stream */
    if (a->r == CUDA_SUCCESS)
        a->r = cu.StreamSynchronize(CU_STREAM_PER_THREAD);
    cu.Pop(&popped);
    return NULL;
}

/* CU_STREAM_PER_THREAD is one stream per thread: work on one thread's does not wait for
 * another's (with one shared stream the blocked host function never lets post run). */
static void test_per_thread_default_stream(void **state)
{
    (void)state;
    sem_t sem;
    sem_init(&sem, 0, 0);
    wait_t w = {&sem, false};
    CUcontext popped;
    pt_arg_t a = {(CUresult(*)(CUstream, CUhostFn, void *))dlsym(fk.lib, "cuLaunchHostFunc_ptsz"),
                  &sem, CUDA_ERROR_UNKNOWN};
    assert_non_null(a.launch);
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.LaunchHostFunc(CU_STREAM_PER_THREAD, wait_fn, &w), CUDA_SUCCESS);
    pthread_t t;
    pthread_create(&t, NULL, post_on_own_stream, &a);
    assert_int_equal(cu.StreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    pthread_join(t, NULL);
    assert_int_equal(a.r, CUDA_SUCCESS);
    assert_true(w.ok);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
    sem_destroy(&sem);
}

/* After a fault every call of the context returns it (other contexts go on), until the
 * primary context is reset, which also destroys what the context owned. */
static void test_sticky_error_until_reset(void **state)
{
    (void)state;
    void (*fault)(int, CUresult) = (void (*)(int, CUresult))dlsym(fk.lib, "fake_cuda_fault");
    CUresult (*reset)(CUdevice) =
        (CUresult(*)(CUdevice))dlsym(fk.lib, "cuDevicePrimaryCtxReset_v2");
    assert_non_null(fault);
    assert_non_null(reset);
    CUdeviceptr p = 0, q = 0;
    CUevent ev;
    CUstream s;
    CUcontext popped;
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.MemAlloc(&p, MiB), CUDA_SUCCESS);
    assert_int_equal(cu.EventCreate(&ev, 0), CUDA_SUCCESS);
    fault(0, CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(cu.MemAlloc(&q, MiB), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(cu.StreamCreate(&s, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(cu.EventQuery(ev), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(cu.MemAlloc(&q, MiB), CUDA_ERROR_ILLEGAL_ADDRESS); /* still */
    assert_int_equal(cu.Push(ctx1), CUDA_SUCCESS);
    assert_int_equal(cu.MemAlloc(&q, MiB), CUDA_SUCCESS); /* device 1 is fine */
    assert_int_equal(cu.MemFree(q), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
    size_t used = fk.used();
    assert_int_equal(reset(0), CUDA_SUCCESS);
    assert_int_equal(fk.used(), used - MiB); /* p went with the context */
    assert_int_equal(cu.MemFree(p), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(cu.EventQuery(ev), CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(cu.MemAlloc(&q, MiB), CUDA_SUCCESS);
    assert_int_equal(cu.MemFree(q), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
}

/* Work touching device bytes no allocation holds (a use after free) faults: the wait for
 * it returns CUDA_ERROR_ILLEGAL_ADDRESS, and so does every later call, until a reset. */
static void test_stray_memset_faults(void **state)
{
    (void)state;
    CUresult (*reset)(CUdevice) =
        (CUresult(*)(CUdevice))dlsym(fk.lib, "cuDevicePrimaryCtxReset_v2");
    CUdeviceptr p = 0;
    CUcontext popped;
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.MemAlloc(&p, MiB), CUDA_SUCCESS);
    assert_int_equal(cu.MemsetD8Async(p, 1, MiB, NULL), CUDA_SUCCESS);
    assert_int_equal(cu.StreamSynchronize(NULL), CUDA_SUCCESS);
    assert_int_equal(cu.MemFree(p), CUDA_SUCCESS);
    assert_int_equal(cu.MemsetD8Async(p, 2, 4096, NULL), CUDA_SUCCESS); /* queued */
    assert_int_equal(cu.StreamSynchronize(NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(cu.MemAlloc(&p, MiB), CUDA_ERROR_ILLEGAL_ADDRESS);
    assert_int_equal(reset(0), CUDA_SUCCESS);
    assert_int_equal(cu.MemAlloc(&p, MiB), CUDA_SUCCESS);
    assert_int_equal(cu.MemFree(p), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
}

/* A fork child gets CUDA_ERROR_NOT_INITIALIZED from every call, cuInit included. */
static void test_fork_child_not_initialized(void **state)
{
    (void)state;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(fk.lib, "cuInit");
    assert_int_equal(init(0), CUDA_SUCCESS);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        CUdeviceptr p;
        CUresult a = init(0);
        CUresult b = cu.Push(ctx0) == CUDA_SUCCESS ? cu.MemAlloc(&p, 4096) : CUDA_ERROR_UNKNOWN;
        _exit(a == CUDA_ERROR_NOT_INITIALIZED && b == CUDA_ERROR_NOT_INITIALIZED ? 0 : 1);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_int_equal(init(0), CUDA_SUCCESS); /* the parent is unaffected */
}

/* Capture: work is recorded, not run; an unsafe call during a global capture fails and
 * invalidates it; relaxed mode allows it; the legacy stream cannot be captured. */
static void test_capture_rules(void **state)
{
    (void)state;
    CUresult (*begin)(CUstream, CUstreamCaptureMode) =
        (CUresult(*)(CUstream, CUstreamCaptureMode))dlsym(fk.lib, "cuStreamBeginCapture_v2");
    CUresult (*end)(CUstream, CUgraph *) =
        (CUresult(*)(CUstream, CUgraph *))dlsym(fk.lib, "cuStreamEndCapture");
    CUresult (*is)(CUstream, CUstreamCaptureStatus *) =
        (CUresult(*)(CUstream, CUstreamCaptureStatus *))dlsym(fk.lib, "cuStreamIsCapturing");
    CUresult (*destroy)(CUgraph) = (CUresult(*)(CUgraph))dlsym(fk.lib, "cuGraphDestroy");
    assert_true(begin && end && is && destroy);
    CUstream s;
    CUgraph g = NULL;
    CUdeviceptr p = 0, d = 0;
    CUstreamCaptureStatus st;
    CUcontext popped;
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu.MemAlloc(&d, 4096), CUDA_SUCCESS);
    assert_int_equal(begin(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL),
                     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(cu.MemsetD8Async(d, 7, 4096, s), CUDA_SUCCESS);
    assert_int_equal(is(s, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(cu.MemAlloc(&p, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(is(s, &st), CUDA_SUCCESS);
    assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    assert_int_equal(end(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_null(g);
    assert_int_equal(*(unsigned char *)fk.shadow((void *)(uintptr_t)d), 0); /* never ran */
    assert_int_equal(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    assert_int_equal(cu.MemAlloc(&p, 4096), CUDA_SUCCESS);
    assert_int_equal(end(s, &g), CUDA_SUCCESS);
    assert_non_null(g);
    assert_int_equal(destroy(g), CUDA_SUCCESS);
    assert_int_equal(cu.MemFree(p), CUDA_SUCCESS);
    assert_int_equal(cu.MemFree(d), CUDA_SUCCESS);
    assert_int_equal(cu.StreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
}

/* The driver's capture rules the drop-in's fixes rely on: a thread in relaxed mode may
 * allocate during another's global capture; an event recorded into a capture cannot be
 * queried or waited for on the host; a stream-ordered free during capture takes only a
 * graph allocation, and anything else invalidates the capture. */
static void test_capture_modes_events_frees(void **state)
{
    (void)state;
#define SYM(t, n) ((t)dlsym(fk.lib, n))
    CUresult (*begin)(CUstream, CUstreamCaptureMode) =
        SYM(CUresult(*)(CUstream, CUstreamCaptureMode), "cuStreamBeginCapture_v2");
    CUresult (*end)(CUstream, CUgraph *) =
        SYM(CUresult(*)(CUstream, CUgraph *), "cuStreamEndCapture");
    CUresult (*destroy)(CUgraph) = SYM(CUresult(*)(CUgraph), "cuGraphDestroy");
    CUresult (*xchg)(CUstreamCaptureMode *) =
        SYM(CUresult(*)(CUstreamCaptureMode *), "cuThreadExchangeStreamCaptureMode");
    CUresult (*alloc_async)(CUdeviceptr *, size_t, CUstream) =
        SYM(CUresult(*)(CUdeviceptr *, size_t, CUstream), "cuMemAllocAsync");
    CUresult (*free_async)(CUdeviceptr, CUstream) =
        SYM(CUresult(*)(CUdeviceptr, CUstream), "cuMemFreeAsync");
#undef SYM
    assert_true(begin && end && destroy && xchg && alloc_async && free_async);
    CUstream s;
    CUgraph g = NULL;
    CUevent ev;
    CUdeviceptr p = 0, d = 0, ga = 0;
    CUcontext popped;
    assert_int_equal(cu.Push(ctx0), CUDA_SUCCESS);
    assert_int_equal(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    assert_int_equal(cu.EventCreate(&ev, 0), CUDA_SUCCESS);
    assert_int_equal(cu.MemAlloc(&d, 4096), CUDA_SUCCESS);
    /* Relaxed around an allocation: the global capture survives it. */
    assert_int_equal(begin(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    assert_int_equal(xchg(&m), CUDA_SUCCESS);
    assert_int_equal(m, CU_STREAM_CAPTURE_MODE_GLOBAL);
    assert_int_equal(cu.MemAlloc(&p, 4096), CUDA_SUCCESS);
    assert_int_equal(xchg(&m), CUDA_SUCCESS);
    assert_int_equal(m, CU_STREAM_CAPTURE_MODE_RELAXED);
    /* An event recorded in the capture. */
    assert_int_equal(cu.EventRecord(ev, s), CUDA_SUCCESS);
    assert_int_equal(cu.EventQuery(ev), CUDA_ERROR_CAPTURED_EVENT);
    assert_int_equal(cu.EventSynchronize(ev), CUDA_ERROR_CAPTURED_EVENT);
    /* A graph allocation may be freed in the capture. */
    assert_int_equal(alloc_async(&ga, 4096, s), CUDA_SUCCESS);
    assert_int_equal(free_async(ga, s), CUDA_SUCCESS);
    assert_int_equal(end(s, &g), CUDA_SUCCESS);
    assert_int_equal(destroy(g), CUDA_SUCCESS);
    assert_int_equal(cu.EventQuery(ev), CUDA_ERROR_CAPTURED_EVENT); /* until recorded again */
    assert_int_equal(cu.EventRecord(ev, s), CUDA_SUCCESS);
    assert_int_equal(cu.EventSynchronize(ev), CUDA_SUCCESS);
    /* A cuMemAlloc pointer freed stream-ordered in a capture: refused, capture invalidated. */
    assert_int_equal(begin(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    assert_int_equal(free_async(d, s), CUDA_ERROR_INVALID_VALUE);
    assert_int_equal(end(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* Thread-local mode ignores another thread's capture only; its own still forbids. */
    assert_int_equal(begin(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    m = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    assert_int_equal(xchg(&m), CUDA_SUCCESS);
    CUdeviceptr q = 0;
    assert_int_equal(cu.MemAlloc(&q, 4096), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    assert_int_equal(xchg(&m), CUDA_SUCCESS);
    assert_int_equal(end(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    assert_int_equal(cu.MemFree(p), CUDA_SUCCESS);
    assert_int_equal(cu.MemFree(d), CUDA_SUCCESS);
    assert_int_equal(cu.EventDestroy(ev), CUDA_SUCCESS);
    assert_int_equal(cu.StreamDestroy(s), CUDA_SUCCESS);
    assert_int_equal(cu.Pop(&popped), CUDA_SUCCESS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_context_required_per_thread),
        cmocka_unit_test(test_streams_events_tied_to_context),
        cmocka_unit_test(test_streams_run_concurrently),
        cmocka_unit_test(test_wait_event_orders_streams),
        cmocka_unit_test(test_legacy_waits_for_blocking_streams),
        cmocka_unit_test(test_host_func_later_elsewhere_no_cuda),
        cmocka_unit_test(test_device_memory_not_host_addressable),
        cmocka_unit_test(test_vmm_strict),
        cmocka_unit_test(test_get_proc_address_flags),
        cmocka_unit_test(test_per_thread_default_stream),
        cmocka_unit_test(test_sticky_error_until_reset),
        cmocka_unit_test(test_stray_memset_faults),
        cmocka_unit_test(test_fork_child_not_initialized),
        cmocka_unit_test(test_capture_rules),
        cmocka_unit_test(test_capture_modes_events_frees),
    };
    return MT_TEST_RUN(tests, setup, fake_ctl_close);
}

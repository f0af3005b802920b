/* A program for tests/replay/check_malloc_trace.sh: four threads that allocate and free
 * through every entry point bench/malloc_trace.c interposes, so that the trace it writes
 * can be checked by the trace loader (every free names a live pointer, sizes agree). */
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define SLOTS 64
#define STEPS 5000

static void *worker(void *arg)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (uintptr_t)arg + 1;
    void *slot[SLOTS] = {0};
    for (int i = 0; i < STEPS; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        void **s = &slot[x % SLOTS];
        size_t size = 1 + (size_t)(x >> 40) % 70000;
        if (*s != NULL && (x & 0x300) == 0) {
            void *p = realloc(*s, size);
            if (p != NULL)
                *s = p;
            continue;
        }
        free(*s);
        *s = NULL;
        switch ((x >> 20) % 5) {
        case 0:
            *s = malloc(size);
            break;
        case 1:
            *s = calloc(1, size);
            break;
        case 2:
            if (posix_memalign(s, 64, size) != 0)
                *s = NULL;
            break;
        case 3:
            *s = aligned_alloc(64, (size + 63) / 64 * 64);
            break;
        default:
            *s = memalign(128, size);
            break;
        }
    }
    for (int i = 0; i < SLOTS; i++)
        free(slot[i]);
    return NULL;
}

int main(void)
{
    pthread_t th[4];
    for (uintptr_t i = 0; i < 4; i++)
        if (pthread_create(&th[i], NULL, worker, (void *)i) != 0)
            return 1;
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    puts("done");
    return 0;
}

/* Looking into a pipe without taking its bytes (analysis/zsource.h: mt__zsrc_pipe_peek), as
 * report, replay, view and export do to tell a PyTorch snapshot on standard input from a log:
 * when the look says the writer has ended, the bytes it saw are all there are, even where the
 * writer sends its last bytes and ends during the look; and a compressed snapshot whose writer
 * stops after its first bytes, then sends the rest and ends at once, is still called a
 * snapshot (the CI failure of memtrace replay on "(head -c 10; sleep; tail -c +11) |").
 *
 * argv[1]: an xz-compressed snapshot. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "analysis/torch_snapshot.h"
#include "analysis/zsource.h"
#include "tests/common/test_main.h"

static const char *xz_path;

/* One writer: head[0, cut), then, once the reader is about to look (and a short spin),
 * the rest, and the end. */
typedef struct writer_s {
    int fd;
    const unsigned char *data;
    size_t len, cut;
    unsigned spin;
    atomic_int go;
} writer_t;

static void put(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k <= 0)
            return;
        p += k;
        n -= (size_t)k;
    }
}

static void *writer_main(void *arg)
{
    writer_t *w = arg;
    put(w->fd, w->data, w->cut);
    while (atomic_load_explicit(&w->go, memory_order_acquire) == 0)
        ;
    for (volatile unsigned i = 0; i < w->spin; i++)
        ;
    put(w->fd, w->data + w->cut, w->len - w->cut);
    close(w->fd);
    return NULL;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static unsigned rnd(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Whether round r is run: all of the first 500, then while the case has run under 1.5 s (a
 * thread per round costs 0.1 ms natively, 10 ms under qemu; the old code failed within
 * rounds 11-2750, so an emulated or sanitized run checks fewer rounds, not none). */
static bool more(unsigned r, double t0)
{
    return r < 500 || now_s() - t0 < 1.5;
}

/* Starts a writer of data on a new pipe (or a socket pair); *rd = the end to read. */
static void start(writer_t *w, pthread_t *t, int *rd, const unsigned char *data, size_t len,
                  size_t cut, bool sock)
{
    int p[2];
    assert_int_equal(sock ? socketpair(AF_UNIX, SOCK_STREAM, 0, p) : pipe(p), 0);
    *w = (writer_t){.fd = p[1], .data = data, .len = len, .cut = cut, .spin = rnd(2000)};
    atomic_init(&w->go, 0);
    *rd = p[0];
    assert_int_equal(pthread_create(t, NULL, writer_main, w), 0);
}

/* When the look says "ended", it saw every byte the writer sent. */
static void ended_means_all_seen(bool sock)
{
    enum { LEN = 1000, CUT = 10, ROUNDS = 20000 };
    double t0 = now_s();
    unsigned r = 0;
    static unsigned char data[LEN], buf[64 * 1024];
    for (size_t i = 0; i < LEN; i++)
        data[i] = (unsigned char)i;
    unsigned ended_seen = 0;
    for (; r < ROUNDS && more(r, t0); r++) {
        writer_t w;
        pthread_t t;
        int rd;
        start(&w, &t, &rd, data, LEN, CUT, sock);
        size_t n = 0;
        bool ended = false;
        atomic_store_explicit(&w.go, 1, memory_order_release);
        assert_int_equal(mt__zsrc_pipe_peek(rd, buf, sizeof buf, &n, &ended), 0);
        assert_true(n == CUT || n == LEN);
        assert_memory_equal(buf, data, n);
        if (ended) {
            ended_seen++;
            if (n != LEN)
                fail_msg("round %u: the look said the writer had ended, with %zu of %d bytes "
                         "seen",
                         r, n, (int)LEN);
        }
        pthread_join(t, NULL);
        /* after the writer: everything, and the end */
        assert_int_equal(mt__zsrc_pipe_peek(rd, buf, sizeof buf, &n, &ended), 0);
        assert_int_equal(n, LEN);
        assert_true(ended);
        close(rd);
    }
    print_message("%s: ended during the first look in %u of %u rounds\n", sock ? "socket" : "pipe",
                  ended_seen, r);
}

static void test_ended_means_all_seen(void **state)
{
    (void)state;
    ended_means_all_seen(false);
}

/* The same through a socket (MSG_PEEK), as a shell's standard input may be. */
static void test_ended_means_all_seen_socket(void **state)
{
    (void)state;
    ended_means_all_seen(true);
}

/* A compressed snapshot sent in two parts, the second with the end, reads as a snapshot. */
static void test_slow_xz_is_a_snapshot(void **state)
{
    (void)state;
    FILE *f = fopen(xz_path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", xz_path);
    static unsigned char data[1 << 20];
    size_t len = fread(data, 1, sizeof data, f);
    fclose(f);
    assert_true(len > 12 && len < sizeof data);
    assert_int_equal(mt__zsrc_sniff(data, len), MT__Z_XZ);
    double t0 = now_s();
    for (unsigned r = 0; r < 3000 && more(r, t0); r++) {
        writer_t w;
        pthread_t t;
        int rd;
        size_t cut = 1 + rnd(11); /* within xz's 12-byte stream header */
        start(&w, &t, &rd, data, len, cut, false);
        char path[32];
        snprintf(path, sizeof path, "/dev/fd/%d", rd);
        atomic_store_explicit(&w.go, 1, memory_order_release);
        bool yes = mt__ts_is_pickle(path);
        pthread_join(t, NULL);
        if (!yes)
            fail_msg("round %u: an xz snapshot sent as %zu bytes, then the rest, was not called "
                     "a snapshot",
                     r, cut);
        /* and its bytes are all still there for its reader */
        static unsigned char back[sizeof data];
        size_t got = 0;
        for (ssize_t k; (k = read(rd, back + got, sizeof back - got)) > 0;)
            got += (size_t)k;
        assert_int_equal(got, len);
        assert_memory_equal(back, data, len);
        close(rd);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SNAPSHOT.xz\n", argv[0]);
        return 2;
    }
    xz_path = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ended_means_all_seen),
        cmocka_unit_test(test_ended_means_all_seen_socket),
        cmocka_unit_test(test_slow_xz_is_a_snapshot),
    };
    return MT_TEST_RUN(tests, NULL, NULL);
}

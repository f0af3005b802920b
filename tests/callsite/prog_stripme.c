/* A small program for tests/callsite/test_symbolize.c, built as is and stripped: prints the
 * file offset (ip - load bias) of a return address inside its static function work(). */
#include <link.h>
#include <stdint.h>
#include <stdio.h>

static volatile uintptr_t sink;

static __attribute__((noinline)) uintptr_t return_address(void)
{
    return (uintptr_t)__builtin_return_address(0);
}

static __attribute__((noinline)) uintptr_t work(void)
{
    uintptr_t ra = return_address();
    sink += ra;
    return ra;
}

static int bias_of_main(struct dl_phdr_info *info, size_t size, void *data)
{
    *(uintptr_t *)data = info->dlpi_addr;
    return 1;
}

int main(void)
{
    uintptr_t bias = 0;
    dl_iterate_phdr(bias_of_main, &bias);
    printf("0x%jx\n", (uintmax_t)(work() - bias));
    return 0;
}

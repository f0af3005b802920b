/* bench_prof's recursion helper, built with -fomit-frame-pointer: call stacks through it
 * must be unwound from DWARF CFI, as in a program built without frame pointers. */
#include "bench/stack_deep.h"

static volatile int sink;

__attribute__((noinline, noipa)) int mt_bench_deep(int depth, int (*fn)(void *), void *ud)
{
    int r = depth <= 1 ? fn(ud) : mt_bench_deep(depth - 1, fn, ud);
    sink = r; /* not a tail call: each level keeps its frame */
    return r + 0 * sink;
}

/* A library the stacks test loads with dlopen after recording began: a stack through it
 * holds an address outside the modules known at start. */
#include <stdint.h>

int stk_late_call(int (*cb)(void));
__attribute__((visibility("default"), noinline)) int stk_late_call(int (*cb)(void))
{
    int r = cb();
    __asm__ volatile("" ::: "memory"); /* not a tail call: this frame stays on the stack */
    return r + 0;
}

/* The few instructions that differ by ISA, behind one name each, so that the layers above
 * build for x86-64 and aarch64 alike (and for anything else with GCC's builtins). */
#ifndef MT_UTIL_CPU_H
#define MT_UTIL_CPU_H

/* A spin-wait hint, for the body of a loop that polls a word another thread will change.
 * x86: pause (the sibling hyperthread runs, and the loop's exit costs no memory-order
 * flush). aarch64: isb, a stall of tens of ns; yield, Linux's choice, is a no-op on
 * Neoverse cores such as Grace's, so PostgreSQL's spin delay and Rust's spin_loop use isb.
 * The hint orders nothing: the loop's atomic loads carry the ordering; the "memory"
 * clobber only keeps the compiler from hoisting a plain load out of the loop. */
static inline void mt__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("isb" ::: "memory");
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

#endif

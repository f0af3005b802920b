/* A call chain of depth frames (this one included) ending in fn(ud); no frame pointers. */
#ifndef MT_BENCH_STACK_DEEP_H
#define MT_BENCH_STACK_DEEP_H

int mt_bench_deep(int depth, int (*fn)(void *), void *ud);

#endif

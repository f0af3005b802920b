/* Host-allocation fault injection for the tests of suite 'fault'.
 *
 * inject.c defines malloc, calloc, realloc, free, the aligned allocators, strdup and
 * strndup in the test executable, so that every host allocation of the process goes
 * through it: memtrace's, jansson's and libuv's, and those glibc makes inside fopen,
 * getline or asprintf (glibc calls the program's malloc). Under AddressSanitizer it
 * forwards to ASan's allocator (its interceptors), else to glibc's, so leak detection
 * keeps working.
 *
 * While armed, the allocations of the arming thread are numbered from 1 (only the first
 * two of each call stack, see inject.c) and the one numbered
 * `fail_at` returns NULL with errno ENOMEM; the others go through. fault_loop() runs a scenario
 * once per allocation site it reaches: fail_at = 1, 2, ... until a run completes with no injected
 * failure. */
#ifndef MT_TESTS_FAULT_INJECT_H
#define MT_TESTS_FAULT_INJECT_H

#include <stdbool.h>
#include <stddef.h>

/* Numbers allocations from now on and fails the fail_at-th (0: fail none). */
void fault_arm(long fail_at);
/* Stops numbering. Returns whether a failure was injected since fault_arm. */
bool fault_disarm(void);
/* For a tool built with the injector: arms with fail_at = $MT_FAULT_AT (if set), numbering
 * the first use of each call stack only, and a failure then writes
 * "mt-fault: host allocation N failed" to stderr. */
void fault_arm_from_env(void);
/* The fail_at of the current (or last) run, for messages. */
long fault_target(void);
/* Allocations numbered since fault_arm. */
long fault_count(void);
/* Host allocations currently live (allocated and not yet freed), process-wide. */
long fault_live(void);

/* A scenario: runs, checks its own results (cmocka asserts), and releases everything it
 * allocated. injected tells it whether the allocation failure happened in it. */
typedef void (*fault_scenario_fn)(void *ud);

/* Runs fn once unarmed (so one-time initialisations of libraries are done), then once per
 * fail_at = 1, 2, ... until a run injects nothing. After every run, the live host
 * allocations must be back where they were (nothing leaked on any failure path). Returns
 * the number of allocation sites failed. Stops with a cmocka failure naming fail_at. */
long fault_loop(const char *name, fault_scenario_fn fn, void *ud);

#endif

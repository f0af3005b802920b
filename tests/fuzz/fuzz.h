/* Shared by the fuzz harnesses: the libFuzzer entry point's prototype (the harnesses are
 * also compiled by gcc into the regression driver, which has no fuzzer headers) and a
 * check that stops a run loudly when a parser breaks the project's input rule. */
#ifndef MT_TESTS_FUZZ_H
#define MT_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* abort() makes both libFuzzer and the regression driver report the input. */
#define FUZZ_CHECK(cond, what)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: %s (%s)\n", __FILE__, __LINE__, what, #cond);                  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#endif

/* Linked into a tool built for the fault loop (memtrace_fault): arms the injector from
 * $MT_FAULT_AT before main, in the main thread. */
#include "inject.h"

__attribute__((constructor)) static void arm_from_env(void)
{
    fault_arm_from_env();
}

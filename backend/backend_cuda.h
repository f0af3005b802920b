/* Internal hooks of the cuda backend, for the preload library and tests (mt__ prefix:
 * reachable from the static library only). Each returns MT_EINVAL (or false) when b is
 * not a cuda backend. */
#ifndef MT_ALLOCATOR_BACKEND_CUDA_H
#define MT_ALLOCATOR_BACKEND_CUDA_H

#include <stdbool.h>
#include <stdint.h>

#include "memtrace/backend.h"

/* True if b was made by the cuda backend. */
bool mt__cuda_is_cuda(const mt_backend_t *b);
/* An mt_stream_t standing for a CUstream the program created itself (cudaStream_t is the
 * same object). The wrapper is borrowed: it lives until the backend is destroyed, and
 * mt_stream_destroy on it forgets the wrapper but leaves the program's stream alone.
 * The same handle always yields the same wrapper, except CU_STREAM_PER_THREAD, which is
 * one stream per thread: each calling thread gets its own wrapper for it (kept until the
 * backend goes, one small record per thread that used it). handle 0 gives NULL (default
 * stream). */
int mt__cuda_stream_wrap(mt_backend_t *b, uintptr_t handle, mt_stream_t **out);
/* The program destroyed its stream handle: later wraps of the same (reused) handle give a
 * new wrapper, with a new id. The old wrapper stays valid for what still refers to it.
 * MT_ENOENT if no wrapper had that handle. */
int mt__cuda_stream_forget(mt_backend_t *b, uintptr_t handle);
/* The calling thread's latest failing CUresult from the cuda backend, and clears it; 0 if
 * none. Lets the drop-in return the driver's own code (illegal address, launch failure,
 * not initialized), which MT_E* codes flatten. */
int mt__cuda_last_result(void);
/* The CUstream behind s (0 for the default stream). */
uintptr_t mt__cuda_stream_handle(const mt_stream_t *s);
/* Whether s is one of b's stream wrappers (s NULL: no). */
bool mt__cuda_stream_is_of(mt_backend_t *b, const mt_stream_t *s);
/* Between enter and leave (nested, per thread), the calling thread's requests serve a
 * stream capture: the device allocations and releases they make run in relaxed capture
 * mode (cuThreadExchangeStreamCaptureMode), as PyTorch's cudaMallocMaybeCapturing does,
 * so that a global-mode capture survives a new segment. */
void mt__cuda_capture_enter(void);
void mt__cuda_capture_leave(void);

#endif

/* libcudnn (and the CUDA runtime calls the cudnn path makes) loaded at run time, as
 * the driver is (backend/cuda_driver.c): libmemtrace loads and runs its other paths on a
 * machine without cuDNN, and the cudnn path says why it cannot start. */
#ifndef MT_RNN_CUDNN_LIB_H
#define MT_RNN_CUDNN_LIB_H

#include <stddef.h>

/* Only builds with cuDNN's headers use it (the layer check compiles each folder's headers
 * without them). */
#if __has_include(<cudnn.h>)
#include <cuda_runtime_api.h>
#include <cudnn.h>

#define MT__DNN_FNS(X)                                                                             \
    X(cudnnGetVersion)                                                                             \
    X(cudnnGetErrorString)                                                                         \
    X(cudnnGetLastErrorString)                                                                     \
    X(cudnnCreate)                                                                                 \
    X(cudnnDestroy)                                                                                \
    X(cudnnSetStream)                                                                              \
    X(cudnnCreateTensorDescriptor)                                                                 \
    X(cudnnDestroyTensorDescriptor)                                                                \
    X(cudnnSetTensorNdDescriptor)                                                                  \
    X(cudnnGetTensorNdDescriptor)                                                                  \
    X(cudnnCreateRNNDescriptor)                                                                    \
    X(cudnnDestroyRNNDescriptor)                                                                   \
    X(cudnnSetRNNDescriptor_v8)                                                                    \
    X(cudnnCreateRNNDataDescriptor)                                                                \
    X(cudnnDestroyRNNDataDescriptor)                                                               \
    X(cudnnSetRNNDataDescriptor)                                                                   \
    X(cudnnCreateDropoutDescriptor)                                                                \
    X(cudnnDestroyDropoutDescriptor)                                                               \
    X(cudnnDropoutGetStatesSize)                                                                   \
    X(cudnnSetDropoutDescriptor)                                                                   \
    X(cudnnGetRNNWeightSpaceSize)                                                                  \
    X(cudnnGetRNNWeightParams)                                                                     \
    X(cudnnGetRNNTempSpaceSizes)                                                                   \
    X(cudnnRNNForward)                                                                             \
    X(cudnnRNNBackwardData_v8)                                                                     \
    X(cudnnRNNBackwardWeights_v8)

#define MT__CUDART_FNS(X)                                                                          \
    X(cudaGetDevice) X(cudaSetDevice) X(cudaGetErrorString) X(cudaRuntimeGetVersion)

/* One member per function, of its own type, named as it is. */
typedef struct mt__dnn_s {
#define MT__DNN_MEMBER(f) __typeof__(f) *f;
    MT__DNN_FNS(MT__DNN_MEMBER)
    MT__CUDART_FNS(MT__DNN_MEMBER)
#undef MT__DNN_MEMBER
} mt__dnn_t;

/* The loaded libraries, each (libcudnn, then the runtime) from the first of:
 * $MEMTRACE_LIBCUDNN / $MEMTRACE_LIBCUDART when it names a file (with a '/': only that file);
 * else that name, or libcudnn.so.<CUDNN_MAJOR> / libcudart.so.<CUDART_VERSION / 1000>,
 * through the loader's search path; else that name in the nvidia/<package>/lib folders of
 * the Python installs (pip wheels), under $MEMTRACE_CUDNN_ROOTS (colon-separated glob
 * patterns of site-packages folders) or the usual places (docs/cudnn.md). Loaded once per
 * process and kept; a failure is not kept (the next call tries again). MT_ENODEV with
 * everything tried, and why each failed, in err when a library or a symbol is missing. */
int mt__dnn_open(const mt__dnn_t **out, char *err, size_t errlen);
/* The file library k (0 libcudnn, 1 the runtime) was loaded from ("" before a load). */
const char *mt__dnn_path(int k);

#endif
#endif

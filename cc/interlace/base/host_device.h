// IL_HOST_DEVICE marks functions that host and device code share (plans, tile orders, queue
// protocols): __host__ __device__ under nvcc, nothing for the host compiler.
#pragma once

#if defined(__CUDACC__)
#define IL_HOST_DEVICE __host__ __device__
#else
#define IL_HOST_DEVICE
#endif

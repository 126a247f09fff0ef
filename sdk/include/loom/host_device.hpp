// LOOM_HOST_DEVICE: marks an inline function that device code calls too (CUDA's __host__
// __device__), so that a GPU kernel and the host run one source of arithmetic: the counter-based
// random numbers (random.hpp), the optimizers' update rules and the sum of squares
// (training_kernels.hpp). Empty for every compiler but nvcc; the host's code is unchanged.
#pragma once

#if defined(__CUDACC__)
#define LOOM_HOST_DEVICE __host__ __device__
#else
#define LOOM_HOST_DEVICE
#endif

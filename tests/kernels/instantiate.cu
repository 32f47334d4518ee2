// nvcc's check of the run-time kernels (tests/test_collectives.py): NVRTC instantiates the templates by
// name when a rank first needs them; here they are instantiated explicitly, so nvcc compiles their
// bodies in CI. The test appends CL_INSTANTIATE_* lines built from the host's own name expressions.
#include "../../src/circuslink/collectives/collectives_kernels.cu"
#include "../../src/circuslink/bench/kernels/allreduce_loop.cu"
#include "collectives_user.cu"

// T first: the name expression (the rest) has a comma of its own.
#define CL_INSTANTIATE_ALLREDUCE(T, ...) \
  template __global__ void __VA_ARGS__(circuslink::collectives::Rings, T*, unsigned long long, int*);
#define CL_INSTANTIATE_TEAM_ALLREDUCE(T, ...) \
  template __global__ void __VA_ARGS__(circuslink::collectives::Team, const T*, T*, unsigned long long, int);
#define CL_INSTANTIATE_TEAM_REDUCE_SCATTER(T, ...) \
  template __global__ void __VA_ARGS__(circuslink::collectives::Team, const T*, T*, unsigned long long);
#define CL_INSTANTIATE_LOOP(T)                                                                                   \
  template __global__ void allreduce_loop<T>(cc::Rings, cc::Team, T*, unsigned long long, unsigned int,          \
                                             unsigned long long*, tr::Handle, int*);                             \
  template __global__ void team_oneshot_loop<T>(cc::Team, T*, unsigned long long, unsigned int,                 \
                                                unsigned long long*, int*);                                      \
  template __global__ void team_stage_loop<T>(cc::Team, T*, unsigned long long, unsigned int, unsigned long long*, \
                                              int*);

template __global__ void fused<float>(cc::Rings, int, float*, unsigned long long, int*);
template __global__ void grid_calls<unsigned int>(cc::Rings, unsigned int*, unsigned long long, unsigned int*,
                                                  unsigned long long, unsigned int, int*);
template __global__ void team_fused<float>(cc::Team, int, float*, unsigned long long, float*, unsigned long long, float*,
                                           int*);

// NVIDIA's occupancy calculator (cuda_occupancy.h, host-only C++) on cases read from stdin, so that
// tests/test_occupancy.py can compare circuslink's model (backends/_occupancy.py) with it on machines
// without a GPU. One case a line:
//   major minor regs_per_sm regs_per_block threads_per_sm max_blocks shared_per_sm shared_per_block
//   shared_optin reserved  num_regs static_shared max_dynamic  threads dynamic_shared
// prints the blocks one SM holds, one number a line.
#include <cstdio>

#include <cuda_occupancy.h>

int main() {
  int major, minor, regs_sm, regs_block, threads_sm, max_blocks, num_regs, threads;
  long long shared_sm, shared_block, optin, reserved, static_shared, max_dynamic, dynamic_shared;
  while (std::scanf("%d %d %d %d %d %d %lld %lld %lld %lld %d %lld %lld %d %lld", &major, &minor, &regs_sm,
                    &regs_block, &threads_sm, &max_blocks, &shared_sm, &shared_block, &optin, &reserved, &num_regs,
                    &static_shared, &max_dynamic, &threads, &dynamic_shared) == 15) {
    cudaOccDeviceProp prop;
    prop.computeMajor = major;
    prop.computeMinor = minor;
    prop.maxThreadsPerBlock = 1024;
    prop.maxThreadsPerMultiprocessor = threads_sm;
    prop.regsPerBlock = regs_block;
    prop.regsPerMultiprocessor = regs_sm;
    prop.warpSize = 32;
    prop.sharedMemPerBlock = (size_t)shared_block;
    prop.sharedMemPerMultiprocessor = (size_t)shared_sm;
    prop.numSms = 132;
    prop.sharedMemPerBlockOptin = (size_t)optin;
    prop.reservedSharedMemPerBlock = (size_t)reserved;
    (void)max_blocks;  // the header keeps its own table of blocks an SM
    cudaOccFuncAttributes attr;  // as the header converts cudaFuncAttributes: opt-in limit, one block barrier
    attr.maxThreadsPerBlock = 1024;
    attr.numRegs = num_regs;
    attr.sharedSizeBytes = (size_t)static_shared;
    attr.partitionedGCConfig = PARTITIONED_GC_OFF;
    attr.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN;
    attr.maxDynamicSharedSizeBytes = (size_t)max_dynamic;
    attr.numBlockBarriers = 1;
    attr.virtualResourceCount = 0;
    cudaOccDeviceState state;
    cudaOccResult result;
    const cudaOccError err =
        cudaOccMaxActiveBlocksPerMultiprocessor(&result, &prop, &attr, &state, threads, (size_t)dynamic_shared);
    std::printf("%d\n", err == CUDA_OCC_SUCCESS ? result.activeBlocksPerMultiprocessor : -1);
  }
  return 0;
}

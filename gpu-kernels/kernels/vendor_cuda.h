// HiSparse kernels: CUDA vendor prelude (NVRTC or nvcc). Prepended to the kernel source (the
// parts gpu-kernels/kernels/*.cuh, in the order gpu-kernels/src/lib.rs gives).
// Every vendor-specific spelling the common source uses is defined here and nowhere else.
#define HS_VENDOR_CUDA 1
#define HS_KERNEL extern "C" __global__
#define HS_BOUNDS(n) __launch_bounds__(n)
#define HS_DEVICE static __device__ __forceinline__
#define HS_SYNC() __syncthreads()
// A block barrier that returns how many threads of the block passed `p` true (one instruction).
#define HS_SYNC_COUNT(p) ((unsigned)__syncthreads_count((p) ? 1 : 0))
// The sum of `v` over the lanes of the calling warp, every lane participating (one instruction,
// sm_80+).
#define HS_WARP_SUM(v) __reduce_add_sync(0xffffffffu, (unsigned)(v))
#define HS_TID ((unsigned)threadIdx.x)
#define HS_NTHREADS ((unsigned)blockDim.x)
#define HS_BID_X ((unsigned)blockIdx.x)
#define HS_BID_Y ((unsigned)blockIdx.y)
#define HS_BID_Z ((unsigned)blockIdx.z)
#define HS_NBLOCKS_X ((unsigned)gridDim.x)
#define HS_NBLOCKS_Y ((unsigned)gridDim.y)
// Lanes of one warp (a compile-time constant).
#define HS_WARP 32u
// Inclusive-scan step inside a warp: the value of the lane `d` below, every lane participating.
#define HS_SHFL_UP_U32(v, d) __shfl_up_sync(0xffffffffu, (v), (d))
// The value of lane `src` of the calling warp, every lane participating.
#define HS_SHFL_U32(v, src) __shfl_sync(0xffffffffu, (v), (src))
// Leading zero bits of a 32-bit value (32 for zero).
#define HS_CLZ(x) __clz((int)(x))
#define HS_SHARED __shared__
#define HS_DYN_SHARED(name) extern __shared__ __align__(16) unsigned char name[]

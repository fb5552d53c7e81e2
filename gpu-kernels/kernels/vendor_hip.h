// HiSparse kernels: HIP vendor prelude (hiprtc, or clang -x hip). Prepended to the kernel source
// (the parts gpu-kernels/kernels/*.cuh, in the order gpu-kernels/src/lib.rs gives).
// hiprtc includes the HIP runtime header implicitly; offline clang builds that pass -nogpuinc
// must provide threadIdx/blockIdx/__syncthreads/atomics themselves before this prelude.
#define HS_VENDOR_HIP 1
#define HS_KERNEL extern "C" __global__
#define HS_BOUNDS(n) __launch_bounds__(n)
#define HS_DEVICE static __device__ __forceinline__
#define HS_SYNC() __syncthreads()
// No HS_SYNC_COUNT: an offline build has no counting barrier (hs_block_sum_small scans instead).
#define HS_TID ((unsigned)threadIdx.x)
#define HS_NTHREADS ((unsigned)blockDim.x)
#define HS_BID_X ((unsigned)blockIdx.x)
#define HS_BID_Y ((unsigned)blockIdx.y)
#define HS_BID_Z ((unsigned)blockIdx.z)
#define HS_NBLOCKS_X ((unsigned)gridDim.x)
#define HS_NBLOCKS_Y ((unsigned)gridDim.y)
// Lanes of one wavefront (64 on CDNA, 32 on RDNA), a compile-time constant.
#if defined(__AMDGCN_WAVEFRONT_SIZE__)
#define HS_WARP ((unsigned)__AMDGCN_WAVEFRONT_SIZE__)
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define HS_WARP ((unsigned)__AMDGCN_WAVEFRONT_SIZE)
#else
#define HS_WARP 64u
#endif
#define HS_SHFL_UP_U32(v, d) __shfl_up((unsigned)(v), (unsigned)(d))
#define HS_SHFL_U32(v, src) __shfl((unsigned)(v), (int)(src))
#define HS_CLZ(x) __clz((int)(x))
#define HS_SHARED __shared__
#define HS_DYN_SHARED(name) extern __shared__ __attribute__((aligned(16))) unsigned char name[]

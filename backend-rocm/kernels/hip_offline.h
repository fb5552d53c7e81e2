// HiSparse kernels: the HIP device environment for an offline build with clang and no ROCm
// headers (`clang -x hip -nogpuinc -nogpulib`). hiprtc provides all of this itself; this header
// provides exactly what vendor_hip.h and the kernel source use, with clang builtins, so the code objects
// embedded in the ROCm backend build anywhere clang has the AMDGPU target.
//
// Definitions follow the HIP headers (amd_hip_runtime.h, amd_device_functions.h,
// amd_hip_atomic.h): barrier = release fence, s_barrier, acquire fence; atomics at agent scope
// (workgroup scope for shared memory is implied by the address space); __shfl_up and __shfl through
// ds_bpermute.

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __host__ __attribute__((host))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(n) __attribute__((amdgpu_flat_work_group_size(1, n)))

typedef unsigned int uint4 __attribute__((ext_vector_type(4)));

static __device__ __forceinline__ uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    uint4 r;
    r.x = x;
    r.y = y;
    r.z = z;
    r.w = w;
    return r;
}

struct hs_hip_dim3 {
    unsigned x, y, z;
};

static __device__ __forceinline__ hs_hip_dim3 hs_hip_thread_idx() {
    return {__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(),
            __builtin_amdgcn_workitem_id_z()};
}
static __device__ __forceinline__ hs_hip_dim3 hs_hip_block_idx() {
    return {__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(),
            __builtin_amdgcn_workgroup_id_z()};
}
static __device__ __forceinline__ hs_hip_dim3 hs_hip_block_dim() {
    return {(unsigned)__builtin_amdgcn_workgroup_size_x(), (unsigned)__builtin_amdgcn_workgroup_size_y(),
            (unsigned)__builtin_amdgcn_workgroup_size_z()};
}
// The dispatch packet's grid size is in work-items; HIP launches whole blocks.
static __device__ __forceinline__ hs_hip_dim3 hs_hip_grid_dim() {
    return {__builtin_amdgcn_grid_size_x() / (unsigned)__builtin_amdgcn_workgroup_size_x(),
            __builtin_amdgcn_grid_size_y() / (unsigned)__builtin_amdgcn_workgroup_size_y(),
            __builtin_amdgcn_grid_size_z() / (unsigned)__builtin_amdgcn_workgroup_size_z()};
}
#define threadIdx (hs_hip_thread_idx())
#define blockIdx (hs_hip_block_idx())
#define blockDim (hs_hip_block_dim())
#define gridDim (hs_hip_grid_dim())

static __device__ __forceinline__ void __syncthreads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

static __device__ __forceinline__ unsigned hs_hip_lane_id() {
    return __builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u));
}

// HIP's __shfl_up(var, delta, width = warpSize) for unsigned values.
static __device__ __forceinline__ unsigned __shfl_up(unsigned var, unsigned delta) {
    const int width = __AMDGCN_WAVEFRONT_SIZE__;
    const int self = (int)hs_hip_lane_id();
    int index = self - (int)delta;
    index = (index < (self & ~(width - 1))) ? self : index;
    return (unsigned)__builtin_amdgcn_ds_bpermute(index << 2, (int)var);
}

// HIP's __shfl(var, src_lane, width = warpSize) for unsigned values.
static __device__ __forceinline__ unsigned __shfl(unsigned var, int src_lane) {
    const int width = __AMDGCN_WAVEFRONT_SIZE__;
    const int self = (int)hs_hip_lane_id();
    const int index = (self & ~(width - 1)) + (src_lane & (width - 1));
    return (unsigned)__builtin_amdgcn_ds_bpermute(index << 2, (int)var);
}

// HIP's __clz: leading zero bits of a 32-bit value (32 for zero).
static __device__ __forceinline__ int __clz(int x) {
    return x == 0 ? 32 : __builtin_clz((unsigned)x);
}

static __device__ __forceinline__ unsigned atomicAdd(unsigned* p, unsigned v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ unsigned atomicOr(unsigned* p, unsigned v) {
    return __hip_atomic_fetch_or(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ unsigned atomicAnd(unsigned* p, unsigned v) {
    return __hip_atomic_fetch_and(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ unsigned atomicMin(unsigned* p, unsigned v) {
    return __hip_atomic_fetch_min(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ int atomicCAS(int* p, int expected, int desired) {
    __hip_atomic_compare_exchange_strong(p, &expected, desired, __ATOMIC_RELAXED, __ATOMIC_RELAXED,
                                         __HIP_MEMORY_SCOPE_AGENT);
    return expected;
}
static __device__ __forceinline__ unsigned atomicExch(unsigned* p, unsigned v) {
    return __hip_atomic_exchange(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ unsigned atomicMax(unsigned* p, unsigned v) {
    return __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// HIP's __threadfence(): a sequentially consistent fence at agent (device) scope.
static __device__ __forceinline__ void __threadfence() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }

// HiSparse kernels: CPU emulation prelude (C++20, g++ or clang++). Prepended to the kernel source
// (the parts gpu-kernels/kernels/*.cuh, in the order gpu-kernels/src/lib.rs gives) so the one kernel
// source can be executed and checked against the reference on a machine without a
// GPU. Blocks run one after another on one OS thread; every thread of a block is a fiber;
// __syncthreads and the warp shuffles park the fiber until every thread they bind has arrived
// (driver.cpp). Correctness only, not speed.
#include <cstdint>
#define HS_VENDOR_CPU 1
struct hs_dim3 {
    unsigned x, y, z;
};
// 16-byte aligned as on the GPU: the test compiles with -fsanitize=alignment, so a misaligned
// 16-, 8- or 4-byte access of a kernel aborts the emulation as it would fault on a GPU.
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
extern thread_local hs_dim3 hs_cpu_tid;
extern hs_dim3 hs_cpu_bid, hs_cpu_bdim, hs_cpu_gdim;
extern unsigned char* hs_cpu_dyn_smem;
void hs_cpu_sync();
unsigned hs_cpu_sync_count(bool p);
unsigned hs_cpu_shfl_up(unsigned v, unsigned d);
unsigned hs_cpu_shfl(unsigned v, unsigned src);
#define HS_KERNEL extern "C"
#define HS_BOUNDS(n)
#define HS_DEVICE static inline
#define HS_SYNC() hs_cpu_sync()
#define HS_SYNC_COUNT(p) hs_cpu_sync_count((p))
#define HS_TID (hs_cpu_tid.x)
#define HS_NTHREADS (hs_cpu_bdim.x)
#define HS_BID_X (hs_cpu_bid.x)
#define HS_BID_Y (hs_cpu_bid.y)
#define HS_BID_Z (hs_cpu_bid.z)
#define HS_NBLOCKS_X (hs_cpu_gdim.x)
#define HS_NBLOCKS_Y (hs_cpu_gdim.y)
#define HS_WARP 32u
#define HS_SHFL_UP_U32(v, d) hs_cpu_shfl_up((v), (d))
#define HS_SHFL_U32(v, src) hs_cpu_shfl((v), (src))
#define HS_CLZ(x) ((unsigned)(x) == 0 ? 32 : __builtin_clz((unsigned)(x)))
// One block runs at a time, so function-local statics are exactly per-block shared memory.
#define HS_SHARED static
#define HS_DYN_SHARED(name) unsigned char* name = hs_cpu_dyn_smem
#define __restrict__ __restrict
static inline int atomicCAS(int* p, int expected, int desired) {
    __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;
}
static inline unsigned atomicMin(unsigned* p, unsigned v) {
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicAnd(unsigned* p, unsigned v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicMax(unsigned* p, unsigned v) {
    unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    }
    return old;
}
#define HS_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)

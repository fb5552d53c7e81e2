// HiSparse kernels: CPU emulation launcher (see vendor_cpu.h). Appended after the kernel source
// together with generated per-kernel wrappers; exposes hs_cpu_launch(kernel index, grid, block,
// dynamic shared bytes, argument addresses) with cuLaunchKernel's argument convention.
//
// Blocks run one after another on the calling OS thread. Each GPU thread of the running block is
// a fiber (ucontext) with its own stack, so a block of 1,024 threads costs 1,024 small stacks, not
// 1,024 OS threads. The scheduler runs every fiber that can run until it parks at a barrier
// (__syncthreads, or the warp barrier of a shuffle) or returns; a barrier opens when every thread
// it binds has arrived. What the emulation keeps from the GPU's barrier semantics, and checks:
//   * no thread passes a block barrier before every thread of the block reached it, and no lane
//     passes a warp barrier before every lane of its warp did;
//   * a warp runs on as soon as its own warp barrier opens (the other warps need not have come
//     as far), and the threads run from one block barrier to the next in an order drawn for
//     every interval (forward, backward, shuffled, or one warp at a time; the draws seeded per
//     block, so runs repeat), so a read of shared memory that another thread writes in the same
//     barrier interval sees the write or not depending on the draw: a missing barrier shows as a
//     result that differs from the reference (shared memory is poisoned before every block);
//   * a barrier some threads of the block never reach (threads that returned, or are waiting at
//     another barrier) is a kernel bug: the emulation aborts naming the block and the barrier,
//     where a GPU would hang or run on undefined.
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

thread_local hs_dim3 hs_cpu_tid;
hs_dim3 hs_cpu_bid, hs_cpu_bdim, hs_cpu_gdim;
unsigned char* hs_cpu_dyn_smem;

namespace {

// Where a fiber is: running (or runnable), parked at a barrier, or returned.
enum class At { Run, Block, Warp, Done };

struct Fiber {
    ucontext_t ctx;
    At at;
};

// Bytes of each fiber's stack (the kernels keep a few hundred bytes of locals), and the guard
// page below each one (an overflow faults instead of corrupting the next stack).
constexpr size_t STACK_BYTES = 256 * 1024;

std::vector<Fiber> g_fibers;
std::vector<unsigned> g_lanes;
ucontext_t g_scheduler;
unsigned g_current;
// The body of the launch, called by each fiber.
void (*g_invoke)(void*);
void* g_body;
// Stacks of the fibers (`g_stack_count` of them, each STACK_BYTES after a guard page).
unsigned char* g_stacks;
size_t g_stack_count;

[[noreturn]] void fail(const char* what) {
    std::fprintf(stderr, "hisparse CPU emulation: block (%u, %u, %u): %s\n", hs_cpu_bid.x,
                 hs_cpu_bid.y, hs_cpu_bid.z, what);
    std::abort();
}

// Parks the running fiber at `at` and returns to the scheduler.
void park(At at) {
    Fiber& f = g_fibers[g_current];
    f.at = at;
    if (swapcontext(&f.ctx, &g_scheduler) != 0) fail("swapcontext failed");
}

// The entry of every fiber: the kernel body, then back to the scheduler through uc_link.
void fiber_main() {
    g_invoke(g_body);
    g_fibers[g_current].at = At::Done;
}

// Room for `n` fiber stacks, each with a guard page below it (kept for later launches).
void reserve_stacks(size_t n) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t each = STACK_BYTES + page;
    if (n <= g_stack_count) return;
    if (g_stacks != nullptr) munmap(g_stacks, g_stack_count * each);
    void* p = mmap(nullptr, n * each, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) fail("cannot map the fiber stacks");
    g_stacks = static_cast<unsigned char*>(p);
    g_stack_count = n;
    for (size_t i = 0; i < n; ++i)
        if (mprotect(g_stacks + i * each, page, PROT_NONE) != 0) fail("cannot protect a stack guard");
}

unsigned char* stack_of(size_t i) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return g_stacks + i * (STACK_BYTES + page) + page;
}

// __syncthreads_count: each thread adds its predicate to its barrier's count before it parks and
// reads the count once the barrier opens. Counting barriers alternate between two counts; the
// last thread to arrive at one clears the other (every thread read that one before it arrived
// here, and none can reach the next counting barrier before this one opens). `g_counted[t]`:
// the counting barriers thread t reached in this block.
std::vector<unsigned> g_counted;
unsigned g_count[2], g_count_arrived[2];

// xorshift64: each interval's order.
unsigned long long g_rng;
unsigned next_random(unsigned n) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (unsigned)(g_rng % n);
}

// Runs fiber `t` until it parks or returns; a warp barrier its arrival fills opens at once (its
// warp runs on without waiting for the other warps).
void step(unsigned t, unsigned bx) {
    g_current = t;
    hs_cpu_tid = {t, 0, 0};
    if (swapcontext(&g_scheduler, &g_fibers[t].ctx) != 0) fail("swapcontext failed");
    if (g_fibers[t].at != At::Warp) return;
    const unsigned w0 = t - t % HS_WARP, n = bx - w0 < HS_WARP ? bx - w0 : HS_WARP;
    for (unsigned l = 0; l < n; ++l)
        if (g_fibers[w0 + l].at != At::Warp) return;
    for (unsigned l = 0; l < n; ++l) g_fibers[w0 + l].at = At::Run;
}

// Runs the fibers in `order` (repeatedly) until none can run.
void run_all(const std::vector<unsigned>& order, unsigned bx) {
    for (bool ran = true; ran;) {
        ran = false;
        for (unsigned t : order)
            if (g_fibers[t].at == At::Run) {
                step(t, bx);
                ran = true;
            }
    }
}

// Shuffles `v` in place.
void shuffle(std::vector<unsigned>& v) {
    for (size_t i = v.size(); i > 1; --i) {
        const unsigned j = next_random((unsigned)i);
        const unsigned x = v[i - 1];
        v[i - 1] = v[j];
        v[j] = x;
    }
}

// Runs the fibers of the current block until every one returned, opening barriers as they fill.
void run_block(unsigned bx) {
    const unsigned warps = (bx + HS_WARP - 1) / HS_WARP;
    std::vector<unsigned> order(bx), lanes, warp_order(warps);
    for (;;) {
        // This barrier interval's order, drawn at random (a fixed sequence would give an interval
        // the same order in every block of a kernel): threads forward, backward or shuffled, or
        // (half the intervals) one warp after another in shuffled order, each until it waits at
        // __syncthreads, as warps drift apart on a GPU.
        const unsigned kind = next_random(6);
        if (kind < 3) {
            for (unsigned i = 0; i < bx; ++i) order[i] = kind == 1 ? bx - 1 - i : i;
            if (kind == 2) shuffle(order);
            run_all(order, bx);
        } else {
            for (unsigned w = 0; w < warps; ++w) warp_order[w] = w;
            shuffle(warp_order);
            for (unsigned w : warp_order) {
                lanes.clear();
                for (unsigned t = w * HS_WARP; t < bx && t < (w + 1) * HS_WARP; ++t)
                    lanes.push_back(t);
                run_all(lanes, bx);
            }
        }
        // No fiber can run: every one returned or waits at a barrier that is not full.
        unsigned done = 0, at_block = 0;
        for (const Fiber& f : g_fibers) {
            done += f.at == At::Done;
            at_block += f.at == At::Block;
        }
        if (done == bx) return;
        if (at_block == bx) {
            for (Fiber& f : g_fibers) f.at = At::Run;
            continue;
        }
        if (at_block + done < bx) fail("a warp shuffle that lanes of the warp never reach");
        fail("__syncthreads that threads which returned never reach");
    }
}

}  // namespace

void hs_cpu_sync() { park(At::Block); }

unsigned hs_cpu_sync_count(bool p) {
    const unsigned k = g_counted[hs_cpu_tid.x]++ & 1u;
    g_count[k] += p ? 1u : 0u;
    if (++g_count_arrived[k] == hs_cpu_bdim.x) g_count[k ^ 1u] = g_count_arrived[k ^ 1u] = 0;
    park(At::Block);
    return g_count[k];
}

unsigned hs_cpu_shfl_up(unsigned v, unsigned d) {
    const unsigned t = hs_cpu_tid.x, lane = t % HS_WARP;
    g_lanes[t] = v;
    park(At::Warp);
    const unsigned r = lane >= d ? g_lanes[t - d] : v;
    // Every lane has read before any lane writes its next value.
    park(At::Warp);
    return r;
}

unsigned hs_cpu_shfl(unsigned v, unsigned src) {
    const unsigned t = hs_cpu_tid.x, lane = t % HS_WARP;
    g_lanes[t] = v;
    park(At::Warp);
    const unsigned r = g_lanes[t - lane + src % HS_WARP];
    // Every lane has read before any lane writes its next value.
    park(At::Warp);
    return r;
}

// Runs `body` once per thread of every block of the grid, the threads of a block as fibers.
template <class F>
static void hs_cpu_run(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned smem, F body) {
    std::vector<unsigned char> dyn(smem + 16);
    hs_cpu_gdim = {gx, gy, gz};
    hs_cpu_bdim = {bx, 1, 1};
    g_lanes.assign(bx, 0);
    g_fibers.assign(bx, Fiber{});
    reserve_stacks(bx);
    g_invoke = [](void* b) { (*static_cast<F*>(b))(); };
    g_body = &body;
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                hs_cpu_bid = {x, y, z};
                // Different (fixed) orders in every block.
                g_rng = 0x9E3779B97F4A7C15ull ^ (x + 1ull) * 0xBF58476D1CE4E5B9ull ^
                        (y + 1ull) * 0x94D049BB133111EBull ^ z;
                g_counted.assign(bx, 0);
                g_count[0] = g_count[1] = g_count_arrived[0] = g_count_arrived[1] = 0;
                // Poison shared memory: kernels must write before they read.
                std::memset(dyn.data(), 0xA5, dyn.size());
                hs_cpu_dyn_smem = dyn.data() + (16 - reinterpret_cast<uintptr_t>(dyn.data()) % 16) % 16;
                for (unsigned t = 0; t < bx; ++t) {
                    Fiber& f = g_fibers[t];
                    if (getcontext(&f.ctx) != 0) fail("getcontext failed");
                    f.ctx.uc_stack.ss_sp = stack_of(t);
                    f.ctx.uc_stack.ss_size = STACK_BYTES;
                    f.ctx.uc_link = &g_scheduler;
                    makecontext(&f.ctx, fiber_main, 0);
                    f.at = At::Run;
                }
                run_block(bx);
            }
}

// A device pointer argument: converts to whatever pointer type the kernel declares.
struct hs_cpu_ptr {
    void* p;
    template <class T>
    operator T*() const { return static_cast<T*>(p); }
};

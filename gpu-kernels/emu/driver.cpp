// HiSparse kernels: CPU emulation launcher (see vendor_cpu.h). Appended after the kernel source
// together with generated per-kernel wrappers; exposes hs_cpu_launch(kernel index, grid, block,
// dynamic shared bytes, argument addresses) with cuLaunchKernel's argument convention.
#include <barrier>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

thread_local hs_dim3 hs_cpu_tid;
hs_dim3 hs_cpu_bid, hs_cpu_bdim, hs_cpu_gdim;
unsigned char* hs_cpu_dyn_smem;

static std::unique_ptr<std::barrier<>> g_block;
static std::vector<std::unique_ptr<std::barrier<>>> g_warps;
static std::vector<unsigned> g_lanes;

void hs_cpu_sync() { g_block->arrive_and_wait(); }

unsigned hs_cpu_shfl_up(unsigned v, unsigned d) {
    const unsigned t = hs_cpu_tid.x, w = t / 32, lane = t % 32;
    g_lanes[t] = v;
    g_warps[w]->arrive_and_wait();
    const unsigned r = lane >= d ? g_lanes[t - d] : v;
    g_warps[w]->arrive_and_wait();
    return r;
}

// Runs `body` once per thread of every block of the grid.
template <class F>
static void hs_cpu_run(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned smem, F body) {
    std::vector<unsigned char> dyn(smem + 16);
    hs_cpu_gdim = {gx, gy, gz};
    hs_cpu_bdim = {bx, 1, 1};
    g_lanes.assign(bx, 0);
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                hs_cpu_bid = {x, y, z};
                // Poison shared memory: kernels must write before they read.
                std::memset(dyn.data(), 0xA5, dyn.size());
                hs_cpu_dyn_smem = dyn.data() + (16 - reinterpret_cast<uintptr_t>(dyn.data()) % 16) % 16;
                g_block = std::make_unique<std::barrier<>>(bx);
                g_warps.clear();
                for (unsigned w = 0; w < (bx + 31) / 32; ++w) {
                    const unsigned n = bx - 32 * w < 32 ? bx - 32 * w : 32;
                    g_warps.push_back(std::make_unique<std::barrier<>>(n));
                }
                std::vector<std::thread> threads;
                threads.reserve(bx);
                for (unsigned t = 0; t < bx; ++t)
                    threads.emplace_back([t, &body] {
                        hs_cpu_tid = {t, 0, 0};
                        body();
                    });
                for (auto& th : threads) th.join();
            }
}

// A device pointer argument: converts to whatever pointer type the kernel declares.
struct hs_cpu_ptr {
    void* p;
    template <class T>
    operator T*() const { return static_cast<T*>(p); }
};

// Random 656-byte rows read by the GPU from pinned host memory, by pool size and by how the
// pool was allocated: what address translation costs when a decode step's misses spread over a
// pool of many requests (one row per 4 KiB page, scattered over tens of GiB).
//
//   nvcc -O3 -arch=sm_90 -o sysmem_gather sysmem_gather.cu
//   ./sysmem_gather [big pool GiB, default 48]         every kind, 687 MB and the big pool
//   ./sysmem_gather --sizes 1,2,4,8,16 [--kinds register,vmm]
//                                                    where the rate falls, GiB by GiB
//   ./sysmem_gather --sizes 1.4,48 --grouped 21,53   rows in groups of 53 (one request's misses
//                                                    of one layer) inside a random 21 MiB window
//                                                    each (its blocks, allocated side by side)
//   ./sysmem_gather --sizes 48 --grouped 21,53 --warps 512,2048
//                                                    the same rows walked in order by 512 (then
//                                                    2048) warps: fewer windows in flight at once
//   ./sysmem_gather --sizes 48 --row-bytes 4096      rows of another size (a multiple of 16; rows
//                                                    are aligned to their size): whether a read
//                                                    costs per row or per page it touches
//
// Kinds: `register` (anonymous memory advised onto transparent huge pages, touched, then
// cudaHostRegister: the runtime's owned pool), `register-4k` (the same on 4 KiB pages),
// `hostalloc` (cudaHostAlloc), `vmm` (cuMemCreate on the host NUMA node, 2 MiB granularity or
// the driver's, mapped for the device). Each reads 2048, 3500 and 16384 random rows per launch,
// 16 launches of distinct rows timed with events; the bulk pinned copy is the ceiling.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

// The driver API functions (the `vmm` kind) come from the runtime's entry-point query, so the
// program links no libcuda stub and builds wherever nvcc does.
template <class F>
static F driver_fn(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found;
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    return nullptr;
  return reinterpret_cast<F>(fn);
}
#define DRIVER(f) static const auto p_##f = driver_fn<decltype(&f)>(#f)

// Bytes of one row (a V3.2 row by default; --row-bytes changes it).
static int kRow = 656;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return false;                                                                  \
    }                                                                                \
  } while (0)
#define CD(x)                                                                 \
  do {                                                                        \
    CUresult r_ = (x);                                                        \
    if (r_ != CUDA_SUCCESS) {                                                 \
      const char* s_ = nullptr;                                               \
      DRIVER(cuGetErrorString);                                               \
      if (p_cuGetErrorString) p_cuGetErrorString(r_, &s_);                    \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?");   \
      return false;                                                           \
    }                                                                         \
  } while (0)

// Lanes of a warp read row `rows[r]`'s `vecs` 16-byte vectors (41 for a V3.2 row) and write
// them to the row's slot; warp w takes rows w, w + W, w + 2W, ... for the launch's W warps (one
// row each when the launch has a warp per row; fewer warps keep fewer rows, and so fewer of a
// list's windows, in flight at once).
__global__ void gather(const uint4* __restrict__ host, const long long* __restrict__ rows, int n,
                       int vecs, uint4* __restrict__ out) {
  const int warps = (gridDim.x * blockDim.x) >> 5;
  const int lane = threadIdx.x & 31;
  for (int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < n; r += warps) {
    const uint4* src = host + rows[r] * vecs;
    uint4* dst = out + (long long)r * vecs;
    for (int v = lane; v < vecs; v += 32) dst[v] = src[v];
  }
}

struct Pool {
  void* ptr = nullptr;  // host address
  void* dev = nullptr;  // device address
  size_t bytes = 0;
  const char* kind = "";
  CUdeviceptr va = 0;
  CUmemGenericAllocationHandle handle = 0;
};

static bool make_pool(const char* kind, size_t bytes, Pool* p) {
  p->kind = kind;
  p->bytes = bytes;
  if (!std::strcmp(kind, "register") || !std::strcmp(kind, "register-4k")) {
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::printf("mmap failed\n");
      return false;
    }
    madvise(m, bytes, !std::strcmp(kind, "register") ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    std::memset(m, 0x5a, bytes);
    p->ptr = m;
    CK(cudaHostRegister(m, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    CK(cudaHostGetDevicePointer(&p->dev, m, 0));
    return true;
  }
  if (!std::strcmp(kind, "hostalloc")) {
    CK(cudaHostAlloc(&p->ptr, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    CK(cudaHostGetDevicePointer(&p->dev, p->ptr, 0));
    return true;
  }
  // vmm: physical host memory of NUMA node 0, mapped into a reserved range for the device.
  DRIVER(cuMemGetAllocationGranularity);
  DRIVER(cuMemCreate);
  DRIVER(cuMemAddressReserve);
  DRIVER(cuMemMap);
  DRIVER(cuMemSetAccess);
  if (!p_cuMemGetAllocationGranularity || !p_cuMemCreate || !p_cuMemAddressReserve || !p_cuMemMap ||
      !p_cuMemSetAccess) {
    std::printf("the driver lacks the virtual memory management calls\n");
    return false;
  }
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  prop.location.id = 0;
  size_t gran = 0;
  CD(p_cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  std::printf("vmm granularity %zu B\n", gran);
  bytes = (bytes + gran - 1) / gran * gran;
  p->bytes = bytes;
  CD(p_cuMemCreate(&p->handle, bytes, &prop, 0));
  CD(p_cuMemAddressReserve(&p->va, bytes, gran, 0, 0));
  CD(p_cuMemMap(p->va, bytes, 0, p->handle, 0));
  CUmemAccessDesc access[2];
  std::memset(access, 0, sizeof access);
  access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access[0].location.id = 0;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CD(p_cuMemSetAccess(p->va, bytes, access, 1));
  p->dev = reinterpret_cast<void*>(p->va);
  // Filled from the device (host access is not asked for).
  CK(cudaMemset(p->dev, 0x5a, bytes));
  CK(cudaDeviceSynchronize());
  return true;
}

static void free_pool(Pool* p) {
  if (!std::strcmp(p->kind, "register") || !std::strcmp(p->kind, "register-4k")) {
    cudaHostUnregister(p->ptr);
    munmap(p->ptr, p->bytes);
  } else if (!std::strcmp(p->kind, "hostalloc")) {
    cudaFreeHost(p->ptr);
  } else {
    DRIVER(cuMemUnmap);
    DRIVER(cuMemAddressFree);
    DRIVER(cuMemRelease);
    if (p_cuMemUnmap) p_cuMemUnmap(p->va, p->bytes);
    if (p_cuMemAddressFree) p_cuMemAddressFree(p->va, p->bytes);
    if (p_cuMemRelease) p_cuMemRelease(p->handle);
  }
}

// GB/s of `launches` gathers of `n` distinct random rows each over the pool.
// Rows drawn in groups of `group_rows`, each inside a random window of `window` bytes (0: every
// row anywhere in the pool).
struct Locality {
  size_t window = 0;
  int group_rows = 1;
  int warps = 0;  // warps of each launch (0: one per row)
};

static bool measure(const Pool& p, int n, const Locality& loc, double* gbs) {
  const int launches = 16;
  long long pool_rows = (long long)(p.bytes / kRow);
  std::mt19937_64 rng(0x5e1f + n);
  std::vector<long long> idx((size_t)n * launches);
  long long window_rows = loc.window ? std::min<long long>(pool_rows, loc.window / kRow) : pool_rows;
  long long base = 0;
  for (size_t i = 0; i < idx.size(); ++i) {
    if (i % loc.group_rows == 0) base = (long long)(rng() % (unsigned long long)(pool_rows - window_rows + 1));
    idx[i] = base + (long long)(rng() % (unsigned long long)window_rows);
  }
  long long* d_idx = nullptr;
  uint4* d_out = nullptr;
  CK(cudaMalloc(&d_idx, idx.size() * sizeof(long long)));
  CK(cudaMalloc(&d_out, (size_t)n * kRow));
  CK(cudaMemcpy(d_idx, idx.data(), idx.size() * sizeof(long long), cudaMemcpyHostToDevice));
  const int threads = 256;
  const int warps = loc.warps > 0 && loc.warps < n ? loc.warps : n;
  const int blocks = (warps * 32 + threads - 1) / threads;
  const uint4* host = static_cast<const uint4*>(p.dev);
  const int vecs = kRow / 16;
  gather<<<blocks, threads>>>(host, d_idx, n, vecs, d_out);  // warm-up (other rows are read below)
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  for (int l = 0; l < launches; ++l) gather<<<blocks, threads>>>(host, d_idx + (size_t)l * n, n, vecs, d_out);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  CK(cudaGetLastError());
  *gbs = (double)n * kRow * launches / (ms * 1e-3) / 1e9;
  cudaFree(d_idx);
  cudaFree(d_out);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return true;
}

static bool bulk_h2d(double* gbs) {
  size_t bytes = 256u << 20;
  void *h = nullptr, *d = nullptr;
  CK(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
  CK(cudaMalloc(&d, bytes));
  CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  for (int i = 0; i < 4; ++i) CK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice));
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  *gbs = 4.0 * bytes / (ms * 1e-3) / 1e9;
  cudaFreeHost(h);
  cudaFree(d);
  return true;
}

// Comma-separated items of `arg`.
static std::vector<std::string> split(const char* arg) {
  std::vector<std::string> out;
  std::string cur;
  for (const char* c = arg; *c; ++c) {
    if (*c == ',') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += *c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

static bool run(const std::vector<size_t>& sizes, const std::vector<std::string>& kinds,
                const Locality& base, const std::vector<int>& warp_counts) {
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  double bulk = 0;
  if (!bulk_h2d(&bulk)) return false;
  std::printf("bulk pinned H2D %.2f GB/s; rows of %d bytes\n", bulk, kRow);
  if (base.window)
    std::printf("rows in groups of %d inside a random %.1f MiB window each\n", base.group_rows,
                base.window / 1048576.0);
  else
    std::printf("rows anywhere in the pool\n");
  std::printf("| kind | pool | rows per launch | warps | GB/s | share of bulk |\n|---|---|---|---|---|---|\n");
  int ok = 0, failed = 0;
  for (size_t size : sizes) {
    for (const std::string& name : kinds) {
      const char* kind = name.c_str();
      Pool p;
      if (!make_pool(kind, size, &p)) {
        std::printf("| %s | %.1f GiB | allocation failed |||\n", kind, size / 1073741824.0);
        ++failed;
        continue;
      }
      for (int n : {2048, 3500, 16384}) {
        for (int w : warp_counts) {
          Locality loc = base;
          loc.warps = w;
          double gbs = 0;
          if (!measure(p, n, loc, &gbs)) {
            ++failed;
            continue;
          }
          std::printf("| %s | %.1f GiB | %d | %s | %.2f | %.3f |\n", kind, p.bytes / 1073741824.0, n,
                      w > 0 && w < n ? std::to_string(w).c_str() : "one per row", gbs, gbs / bulk);
          std::fflush(stdout);
          ++ok;
        }
      }
      free_pool(&p);
    }
  }
  std::printf("%d figures, %d failures\n", ok, failed);
  return ok > 0 && failed == 0;
}

int main(int argc, char** argv) {
  std::vector<std::string> kinds = {"register", "register-4k", "hostalloc", "vmm"};
  std::vector<size_t> sizes = {(size_t)687 << 20, (size_t)48 << 30};
  Locality loc;
  std::vector<int> warp_counts = {0};
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sizes") && i + 1 < argc) {
      sizes.clear();
      for (const std::string& g : split(argv[++i])) sizes.push_back((size_t)(std::stod(g) * 1073741824.0));
    } else if (!std::strcmp(argv[i], "--grouped") && i + 1 < argc) {
      std::vector<std::string> g = split(argv[++i]);
      if (g.size() != 2 || std::stod(g[0]) <= 0 || std::stoi(g[1]) <= 0) {
        std::printf("--grouped MIB,ROWS: a window in MiB and the rows drawn inside each\n");
        return 2;
      }
      loc.window = (size_t)(std::stod(g[0]) * 1048576.0);
      loc.group_rows = std::stoi(g[1]);
    } else if (!std::strcmp(argv[i], "--warps") && i + 1 < argc) {
      warp_counts.clear();
      for (const std::string& w : split(argv[++i])) {
        warp_counts.push_back(std::atoi(w.c_str()));
        if (warp_counts.back() < 0) {
          std::printf("--warps W,W,...: warps per launch (0: one per row)\n");
          return 2;
        }
      }
    } else if (!std::strcmp(argv[i], "--row-bytes") && i + 1 < argc) {
      kRow = std::atoi(argv[++i]);
      if (kRow <= 0 || kRow % 16 != 0 || kRow > (1 << 20)) {
        std::printf("--row-bytes N: a multiple of 16 from 16 to 1 MiB\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--kinds") && i + 1 < argc) {
      kinds = split(argv[++i]);
    } else if (argv[i][0] != '-') {
      sizes = {(size_t)687 << 20, (size_t)std::strtoull(argv[i], nullptr, 10) << 30};
    } else {
      std::printf("usage: sysmem_gather [GiB] [--sizes G,G,...] [--kinds register,register-4k,hostalloc,vmm] "
                  "[--grouped MIB,ROWS] [--warps W,W,...] [--row-bytes N]\n");
      return 2;
    }
  }
  for (const std::string& k : kinds) {
    if (k != "register" && k != "register-4k" && k != "hostalloc" && k != "vmm") {
      std::printf("unknown kind %s: register, register-4k, hostalloc or vmm\n", k.c_str());
      return 2;
    }
  }
  return run(sizes, kinds, loc, warp_counts) ? 0 : 1;
}

// Measurement probes of the CUDA kernel lab (never part of a published crate): the floor of a
// launch, and the SM clock a timed run ran at. Plain CUDA; compiled by NVRTC at run time.

typedef unsigned long long u64;

// An empty kernel: the launch cost the decode-path kernels are compared with.
extern "C" __global__ void lab_empty() {}

// Every block spins until `ns` nanoseconds of the global timer have passed: sustained work that
// brings the GPU's clocks up (they fall while it idles between tiny kernels). Block 0's thread 0
// writes the SM clock cycles and timer nanoseconds of its spin to out[0] and out[1]; their ratio
// is the SM clock the spin ran at.
extern "C" __global__ void lab_clock_probe(u64* out, u64 ns) {
    u64 t0, t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const long long c0 = clock64();
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    } while (t1 - t0 < ns);
    const long long c1 = clock64();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = (u64)(c1 - c0);
        out[1] = t1 - t0;
    }
}

//! A runtime whose host pool cannot fit the RAM available is refused before anything is
//! allocated, with a message naming the limit and the flags that set the host budget.

use hisparse_backend_cpu::CpuDevice;
use hisparse_core::config::HiSparseConfig;
use hisparse_core::layout::{LayoutInput, plan_layout};
use hisparse_core::model::{LayerSpec, ModelSpec};
use hisparse_core::{Error, ErrorKind};
use hisparse_runtime::{Runtime, RuntimeConfig};

/// `VmPeak` of this process: the largest its address space has been.
fn vm_peak() -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = text.lines().find(|l| l.starts_with("VmPeak:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

#[test]
fn a_host_pool_beyond_the_available_ram_is_refused_before_anything_is_allocated() {
    static LAYERS: [LayerSpec; 1] = [LayerSpec::sparse_leader(32, 16)];
    let model = ModelSpec {
        name: "one layer",
        block_tokens: 8,
        top_k: 8,
        layers: &LAYERS,
    };
    let available = hisparse_runtime::host_memory::available_ram().expect("MemAvailable");
    let mut cfg = HiSparseConfig::new(8, available.saturating_mul(2));
    cfg.device_buffer_size = Some(16);
    let mut input = LayoutInput::new(&model, &cfg, 0, 128);
    input.num_gpu_blocks_override = Some(40);
    let kv = plan_layout(&input).unwrap();
    assert!(kv.host_pool_bytes() > available);
    let peak = vm_peak();
    let e = match Runtime::new(CpuDevice::new(), kv, RuntimeConfig::new(2, 2)) {
        Ok(_) => panic!("a host pool of twice the available RAM was allocated"),
        Err(e) => e,
    };
    assert!(
        matches!(
            e.kind(),
            ErrorKind::OutOfPinnedMemory | ErrorKind::OutOfDeviceMemory
        ),
        "{e}"
    );
    let msg = e.to_string();
    for needle in [
        "MemAvailable",
        "--host-mem",
        "host_mem=",
        "host_budget_bytes",
    ] {
        assert!(msg.contains(needle), "{needle}: {msg}");
    }
    assert!(
        vm_peak() < peak + available / 2,
        "the address space grew by the pool's size before the refusal"
    );
}

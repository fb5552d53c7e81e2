//! One host pool for every rank of a node, on a GPU (`harness = false`): a shared-memory segment
//! is mapped twice (two [`SharedSegment`]s, as two ranks would map it), each mapping becomes a
//! pinned host buffer ([`CudaDevice::host_buffer_from_shared`]) — of device 1 for the second
//! mapping when the machine has two GPUs, else of device 0 as well — and:
//!
//! * a device→host copy written through the first buffer is read back through the second with a
//!   host→device copy, and the swap-in gather kernel reads the same rows through the second
//!   buffer's device mapping;
//! * the opener's buffer drops first and the creator's keeps working;
//! * a mapping the driver knows already is not registered a second time.
//!
//! Without a GPU the test says `SKIPPED` and passes, unless `HISPARSE_REQUIRE_DEVICE=1`.

use hisparse_backend_cuda::{CudaDevice, CudaError};
use hisparse_conformance::check::Check;
use hisparse_core::ops::{GatherArgs, GatherDesc, LayerPair, PageLayout};
use hisparse_core::{Device, Error as _};
use hisparse_host_memory::SharedSegment;

type Res<T> = Result<T, String>;

fn e(err: CudaError) -> String {
    format!("{err} [{}]", err.kind())
}

const ROW: u32 = 656;
const BLOCK: u32 = 64;
const BLOCKS: u32 = 4;

fn run(first: &CudaDevice, second: &CudaDevice) -> Res<()> {
    let page = u64::from(ROW * BLOCK);
    let len = (page * u64::from(BLOCKS)) as usize;
    let name = SharedSegment::unique_name("hisparse-cuda-test");
    let seg_a = SharedSegment::create(&name, len).map_err(|e| e.to_string())?;
    let seg_b = SharedSegment::open(&name, len).map_err(|e| e.to_string())?;
    let mut a = first.host_buffer_from_shared(seg_a).map_err(e)?;
    let b = second.host_buffer_from_shared(seg_b).map_err(e)?;
    if !(a.is_shared() && b.is_shared()) {
        return Err("a buffer over a segment does not say it is shared".into());
    }
    if !(first.registered_here(&a) && second.registered_here(&b)) {
        return Err("a segment's mapping was not registered by the backend".into());
    }
    if first.pinned_address(&a) == second.pinned_address(&b) {
        return Err("the two mappings have one address".into());
    }

    // Rank "0" writes two pages through its buffer (a device→host copy, as a backup would).
    let data: Vec<u8> = (0..2 * page as usize)
        .map(|i| (i.wrapping_mul(31) % 251) as u8)
        .collect();
    let s1 = first.create_stream().map_err(e)?;
    let mut src = first.alloc(data.len()).map_err(e)?;
    first.upload(&mut src, 0, &data).map_err(e)?;
    first
        .copy_to_host(&s1, &src, 0, &mut a, page as usize, data.len())
        .map_err(e)?;
    first.synchronize(&s1).map_err(e)?;

    // Rank "1" reads them through its own mapping: a host→device copy ...
    let s2 = second.create_stream().map_err(e)?;
    let mut back = second.alloc(data.len()).map_err(e)?;
    second
        .copy_to_device(&s2, &b, page as usize, &mut back, 0, data.len())
        .map_err(e)?;
    second.synchronize(&s2).map_err(e)?;
    let mut got = vec![0u8; data.len()];
    second.download(&back, 0, &mut got).map_err(e)?;
    if got != data {
        return Err(
            "a host→device copy through the second mapping did not see the first \
                    mapping's device→host copy"
                .into(),
        );
    }

    // ... and the swap-in gather kernel, which reads host rows through the device mapping:
    // rows 64..=127 (block 1) and 130 (block 2, row 2) into device rows 0..=64.
    let layer = [LayerPair {
        host: PageLayout::contiguous(0, page, BLOCKS, BLOCK, ROW),
        device: PageLayout::contiguous(0, page, 2, BLOCK, ROW),
    }];
    let plan_src: Vec<i32> = (64..128).chain([130]).collect();
    let plan_dst: Vec<i32> = (0..plan_src.len() as i32).collect();
    let k = plan_src.len() as u32;
    let up = |v: &[i32]| -> Res<hisparse_backend_cuda::CudaBuffer> {
        let mut buf = second.alloc(v.len() * 4).map_err(e)?;
        second.upload_i32(&mut buf, 0, v).map_err(e)?;
        Ok(buf)
    };
    let (src_b, dst_b, cnt_b) = (up(&plan_src)?, up(&plan_dst)?, up(&[k as i32])?);
    let mut pool = second.alloc((2 * page) as usize).map_err(e)?;
    second
        .gather_rows(
            &s2,
            &GatherDesc {
                num_tokens: 1,
                top_k: k,
                layers: &layer,
            },
            GatherArgs {
                plan_src: &src_b,
                plan_dst: &dst_b,
                plan_counts: &cnt_b,
                host: &b,
                device: &mut pool,
            },
        )
        .map_err(e)?;
    second.synchronize(&s2).map_err(e)?;
    let mut rows = vec![0u8; (2 * page) as usize];
    second.download(&pool, 0, &mut rows).map_err(e)?;
    let row = ROW as usize;
    for (i, &g) in plan_src.iter().enumerate() {
        // Host row g is byte (g - 64) * ROW of `data` (which starts at host block 1).
        let at = (g as usize - 64) * row;
        if rows[i * row..(i + 1) * row] != data[at..at + row] {
            return Err(format!(
                "the gather through the second mapping read host row {g} wrongly"
            ));
        }
    }

    // The opener's buffer goes first; the creator's mapping keeps the bytes.
    drop(b);
    let mut head = vec![0u8; 64];
    first.read_pinned(&a, page as usize, &mut head).map_err(e)?;
    if head[..] != data[..64] {
        return Err("the creator's mapping lost its contents when the opener's dropped".into());
    }
    // A mapping the driver knows is used as it is, never registered twice.
    let seg_c = SharedSegment::open(&name, len).map_err(|e| e.to_string())?;
    let c = first.host_buffer_from_shared(seg_c).map_err(e)?;
    let at = first.pinned_address(&c) as *mut u8;
    // SAFETY: `c` (which owns the mapping) outlives the lent buffer, which is dropped at once;
    // the lent buffer is checked against the driver's records of memory `c` pinned.
    if let Ok(w) = unsafe { first.lend_host_memory(at, len) }
        && first.registered_here(&w)
    {
        return Err("a registered segment mapping was registered a second time".into());
    }
    drop(c);
    Ok(())
}

fn main() {
    let check = Check::one("shared_host_pool_seen_through_two_mappings");
    let first = check.device(CudaDevice::open(0));
    // Two ranks on two GPUs where the machine has them, else both on device 0.
    let second = CudaDevice::open(1).ok();
    let second_ref = second.as_ref().unwrap_or(&first);
    println!(
        "devices: {} and {}",
        first.device_name(),
        second_ref.device_name()
    );
    check.finish(run(&first, second_ref))
}

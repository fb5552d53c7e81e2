//! The host pool on a GPU (`harness = false`): a pool of about 200 MiB — allocated by the
//! backend, registered in 16 MiB chunks and whole, and an engine's plain array lent and
//! registered — is zeroed where the backend allocated it, and the swap-in gather kernel reads
//! rows that straddle every chunk boundary through the device mapping byte for byte, and the
//! driver's bulk copies of the whole pool (split at the chunk boundaries) move every byte both
//! ways; after the
//! drop the release (on its own thread) unregisters and unmaps the backend's pool, and the
//! lent array is unregistered before the drop returns and still holds its bytes.
//!
//! Without a GPU the test says `SKIPPED` and passes, unless `HISPARSE_REQUIRE_DEVICE=1`.

use std::time::Duration;

use cudarc::driver::sys::{self, CUresult};
use hisparse_backend_cuda::{CudaBuffer, CudaDevice, CudaError, CudaHostBuffer};
use hisparse_conformance::check::Check;
use hisparse_core::ops::{BufferLen, GatherArgs, GatherDesc, LayerPair, PageLayout};
use hisparse_core::{Device, Error as _};
use hisparse_host_memory::{HostPoolConfig, Registration, is_mapped, wait_for_releases};

type Res<T> = Result<T, String>;

fn e(err: CudaError) -> String {
    format!("{err} [{}]", err.kind())
}

const ROW: u32 = 656;
const BLOCK: u32 = 64;
const BLOCKS: u32 = 5000;
const CHUNK: usize = 16 << 20;

fn page() -> u64 {
    u64::from(ROW * BLOCK)
}

/// The byte a pool holds at `i` once written.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(0x9E37_79B9) >> 7) as u8 | 1
}

/// Whether the driver knows `ptr` (registered or allocated pinned memory).
fn driver_knows(ptr: usize) -> bool {
    let mut t = 0u32;
    // SAFETY: `t` is a writable u32, the type of CU_POINTER_ATTRIBUTE_MEMORY_TYPE.
    let code = unsafe {
        sys::cuPointerGetAttribute(
            (&raw mut t).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as u64,
        )
    };
    code == CUresult::CUDA_SUCCESS
}

/// Host rows whose bytes straddle a chunk boundary, plus the first and the last row.
fn straddling_rows(len: usize) -> Vec<i32> {
    let rows = len / ROW as usize;
    let mut v: Vec<i32> = (1..len.div_ceil(CHUNK))
        .map(|k| (k * CHUNK / ROW as usize) as i32)
        .collect();
    v.push(0);
    v.push(rows as i32 - 1);
    v
}

/// Gathers `rows` of `host` through the device mapping and checks them against `want(i)`.
fn gather_check(
    dev: &CudaDevice,
    host: &CudaHostBuffer,
    rows: &[i32],
    want: impl Fn(usize) -> u8,
) -> Res<()> {
    let s = dev.create_stream().map_err(e)?;
    let blocks_out = (rows.len() as u32).div_ceil(BLOCK);
    let layer = [LayerPair {
        host: PageLayout::contiguous(0, page(), BLOCKS, BLOCK, ROW),
        device: PageLayout::contiguous(0, page(), blocks_out, BLOCK, ROW),
    }];
    let dst: Vec<i32> = (0..rows.len() as i32).collect();
    let up = |v: &[i32]| -> Res<CudaBuffer> {
        let mut b = dev.alloc(v.len() * 4).map_err(e)?;
        dev.upload_i32(&mut b, 0, v).map_err(e)?;
        Ok(b)
    };
    let (src_b, dst_b, cnt_b) = (up(rows)?, up(&dst)?, up(&[rows.len() as i32])?);
    let mut out = dev
        .alloc((page() * u64::from(blocks_out)) as usize)
        .map_err(e)?;
    dev.gather_rows(
        &s,
        &GatherDesc {
            num_tokens: 1,
            top_k: rows.len() as u32,
            layers: &layer,
        },
        GatherArgs {
            plan_src: &src_b,
            plan_dst: &dst_b,
            plan_counts: &cnt_b,
            host,
            device: &mut out,
        },
    )
    .map_err(e)?;
    dev.synchronize(&s).map_err(e)?;
    let mut got = vec![0u8; rows.len() * ROW as usize];
    dev.download(&out, 0, &mut got).map_err(e)?;
    for (i, &g) in rows.iter().enumerate() {
        let at = g as usize * ROW as usize;
        let row = &got[i * ROW as usize..(i + 1) * ROW as usize];
        if let Some(j) = (0..ROW as usize).find(|&j| row[j] != want(at + j)) {
            return Err(format!(
                "host row {g} (bytes {at}..) read through the device mapping differs at byte {j}"
            ));
        }
    }
    Ok(())
}

/// Copies the whole pool to the device and back with the driver's bulk copies, which span every
/// chunk registered separately, and checks both directions byte for byte (`want(i)`: byte `i`
/// of the pool before; the pool holds `!want(i)` after).
fn bulk_copy_check(
    dev: &CudaDevice,
    host: &mut CudaHostBuffer,
    want: impl Fn(usize) -> u8,
) -> Res<()> {
    let s = dev.create_stream().map_err(e)?;
    let len = host.byte_len() as usize;
    let mut d = dev.alloc(len).map_err(e)?;
    dev.copy_to_device(&s, host, 0, &mut d, 0, len).map_err(e)?;
    dev.synchronize(&s).map_err(e)?;
    let mut got = vec![0u8; len];
    dev.download(&d, 0, &mut got).map_err(e)?;
    if let Some(i) = (0..len).find(|&i| got[i] != want(i)) {
        return Err(format!("byte {i} of a bulk copy host → device differs"));
    }
    let flipped: Vec<u8> = got.iter().map(|b| !b).collect();
    dev.upload(&mut d, 0, &flipped).map_err(e)?;
    dev.copy_to_host(&s, &d, 0, host, 0, len).map_err(e)?;
    dev.synchronize(&s).map_err(e)?;
    dev.read_pinned(host, 0, &mut got).map_err(e)?;
    if let Some(i) = (0..len).find(|&i| got[i] != !want(i)) {
        return Err(format!("byte {i} of a bulk copy device → host differs"));
    }
    Ok(())
}

/// A pool the backend allocates, registered as `registration` says.
fn owned(base: &CudaDevice, registration: Registration) -> Res<String> {
    let dev = CudaDevice::open(0)
        .map_err(e)?
        .with_host_pool_config(HostPoolConfig {
            registration,
            chunk_bytes: Some(CHUNK),
            ..*base.host_pool_config()
        });
    let len = (page() * u64::from(BLOCKS)) as usize;
    let mut pool = dev.alloc_pinned(len).map_err(e)?;
    let setup = pool
        .setup()
        .cloned()
        .ok_or("the backend's pool has no set-up")?;
    let addr = dev.pinned_address(&pool);
    let mut bytes = vec![0u8; len];
    dev.read_pinned(&pool, 0, &mut bytes).map_err(e)?;
    if let Some(i) = bytes.iter().position(|&b| b != 0) {
        return Err(format!("byte {i} of a new pool is not zero"));
    }
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = pattern(i);
    }
    dev.write_pinned(&mut pool, 0, &bytes).map_err(e)?;
    gather_check(&dev, &pool, &straddling_rows(len), pattern)?;
    bulk_copy_check(&dev, &mut pool, pattern)?;
    drop(pool);
    if !wait_for_releases(Duration::from_secs(60)) {
        return Err("the pool's release did not finish within 60 s".into());
    }
    if is_mapped(addr, len) || driver_knows(addr) {
        return Err("the released pool is still mapped or registered".into());
    }
    Ok(format!("{registration:?}: {setup:?}"))
}

/// An engine's plain array, lent and registered.
fn lent(dev: &CudaDevice) -> Res<String> {
    let len = (page() * u64::from(BLOCKS)) as usize;
    let layout = std::alloc::Layout::from_size_align(len, 4096).map_err(|x| x.to_string())?;
    // SAFETY: a non-zero size and a valid alignment.
    let p = unsafe { std::alloc::alloc(layout) };
    if p.is_null() {
        return Err("the engine's array could not be allocated".into());
    }
    // SAFETY: `p` holds `len` bytes the test owns.
    let array = unsafe { std::slice::from_raw_parts_mut(p, len) };
    for (i, b) in array.iter_mut().enumerate() {
        *b = pattern(i) ^ 0x5A;
    }
    let dev = CudaDevice::open(0)
        .map_err(e)?
        .with_host_pool_config(HostPoolConfig {
            chunk_bytes: Some(CHUNK),
            ..*dev.host_pool_config()
        });
    // SAFETY: the array outlives the buffer (dropped below, before the array is freed) and the
    // test touches it only through the backend meanwhile.
    let mut buf = unsafe { dev.lend_host_memory(p, len) }.map_err(e)?;
    let setup = buf
        .setup()
        .cloned()
        .ok_or("the lent array was not registered here")?;
    let result = gather_check(&dev, &buf, &straddling_rows(len), |i| pattern(i) ^ 0x5A)
        .and_then(|()| bulk_copy_check(&dev, &mut buf, |i| pattern(i) ^ 0x5A));
    drop(buf);
    let still_known = driver_knows(p as usize);
    // SAFETY: the array as written above: the lend must have kept every byte.
    let intact = unsafe { std::slice::from_raw_parts(p, len) }
        .iter()
        .enumerate()
        .all(|(i, &b)| b == !(pattern(i) ^ 0x5A));
    // SAFETY: allocated above with this layout, freed once, unregistered already.
    unsafe { std::alloc::dealloc(p, layout) };
    result?;
    if still_known {
        return Err("the lent array is still registered after its buffer dropped".into());
    }
    if !intact {
        return Err("the lent array does not hold what the device wrote last".into());
    }
    Ok(format!("lent: {setup:?}"))
}

fn run(dev: &CudaDevice) -> Res<Vec<String>> {
    Ok(vec![
        owned(dev, Registration::Chunks)?,
        owned(dev, Registration::Whole)?,
        lent(dev)?,
    ])
}

fn main() {
    const NAME: &str = "host_pool_registered_in_chunks_read_through_the_device_mapping";
    let check = Check::one(NAME);
    let dev = check.device(CudaDevice::open(0));
    println!(
        "device {} (NUMA node {:?})",
        dev.device_name(),
        dev.numa_node()
    );
    let result = run(&dev).map(|lines| {
        for l in lines {
            println!("  {l}");
        }
        println!("ok: {NAME}");
    });
    check.finish(result)
}

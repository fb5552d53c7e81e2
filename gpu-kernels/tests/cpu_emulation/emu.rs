//! The emulation itself: the kernel source built for the CPU with launch wrappers generated
//! from the ABI table, and the execution of a plan's launches as a backend would run them.

use super::*;

pub(crate) type LaunchFn =
    unsafe extern "C" fn(u32, u32, u32, u32, u32, u32, *mut *mut c_void) -> i32;

pub(crate) struct Emu {
    _lib: libloading::Library,
    launch: LaunchFn,
}

impl Emu {
    /// Executes `plan` as a backend would: stages its lists (16-byte aligned copies), places a
    /// workspace whose counter area is zero and whose rest is garbage (kernels must initialise
    /// what they read), resolves the symbolic pointers and runs the launches in order.
    /// Returns the stream's counter words after the launches: the launches must have left all
    /// but the third zero (the next launch finds them so), the third is the most entries one
    /// launch took.
    pub(crate) fn execute(&self, mut plan: Plan) -> Vec<u32> {
        let staged: Vec<Vec<u128>> = plan
            .staged
            .iter()
            .map(|p| {
                let b = &p.bytes;
                let mut v = vec![0u128; b.len().div_ceil(16).max(1)];
                bytemuck::cast_slice_mut::<u128, u8>(&mut v)[..b.len()].copy_from_slice(b);
                v
            })
            .collect();
        let addrs: Vec<u64> = staged.iter().map(|v| a(v)).collect();
        let mut workspace = vec![
            0xA5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5_A5A5u128;
            (plan.workspace_bytes as usize).div_ceil(16) + 1
        ];
        let ws = if plan.workspace_bytes > 0 {
            am(&mut workspace)
        } else {
            0
        };
        // The stream's counters: zero before the launches (a stream made just now).
        let mut counters = vec![0u32; (gk::WORKSPACE_COUNTER_BYTES / 4) as usize];
        let ctr = am(&mut counters);
        for l in &mut plan.launches {
            let abi = l.kernel.abi();
            l.args.matches(&abi).unwrap();
            assert!(
                l.block == abi.block_threads
                    || (abi.variable_block && l.block <= abi.block_threads && l.block % 64 == 0),
                "{}: block {}",
                abi.name,
                l.block
            );
            l.args.resolve(&addrs, ws, ctr).unwrap();
            let mut ptrs = l.args.pointers().unwrap();
            let idx = Kernel::ALL
                .iter()
                .position(|x| *x == l.kernel)
                .expect("kernel") as u32;
            // SAFETY: the generated wrapper reads exactly one argument address per parameter with
            // the ABI table's types (checked above), and every pointer argument addresses a live
            // host vector (the test's buffers, the staged copies, the workspace) that the core's
            // `check` (run by the reference first) proved large enough.
            let rc = unsafe {
                (self.launch)(
                    idx,
                    l.grid[0],
                    l.grid[1],
                    l.grid[2],
                    l.block,
                    l.shared,
                    ptrs.as_mut_ptr(),
                )
            };
            assert_eq!(rc, 0);
        }
        drop(staged);
        drop(workspace);
        counters
    }
}

pub(crate) fn wrappers() -> String {
    let mut s = String::from(
        "extern \"C\" int hs_cpu_launch(unsigned k, unsigned gx, unsigned gy, unsigned gz, \
         unsigned bx, unsigned smem, void** a) {\n  switch (k) {\n",
    );
    for (i, k) in Kernel::ALL.iter().enumerate() {
        let abi = k.abi();
        let args: Vec<String> = abi
            .params
            .iter()
            .enumerate()
            .map(|(j, p)| match p.ty {
                Param::Ptr => format!("hs_cpu_ptr{{*(void**)a[{j}]}}"),
                Param::I32 => format!("*(i32*)a[{j}]"),
                Param::U32 => format!("*(u32*)a[{j}]"),
                Param::U64 => format!("*(u64*)a[{j}]"),
                Param::GatherLayers => format!("*(hs_gather_layers*)a[{j}]"),
            })
            .collect();
        s.push_str(&format!(
            "  case {i}: hs_cpu_run(gx, gy, gz, bx, smem, [a] {{ {}({}); }}); return 0;\n",
            abi.name,
            args.join(", ")
        ));
    }
    s.push_str("  }\n  return 1;\n}\n");
    s
}

pub(crate) fn build() -> Result<Emu, EmulationBuildError> {
    let src = format!(
        "{}{}{}{}",
        include_str!("../../emu/vendor_cpu.h"),
        gk::COMMON_SOURCE,
        include_str!("../../emu/driver.cpp"),
        wrappers()
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hisparse-cpu-emulation");
    let so = build_emulation(&dir, "hisparse_cpu", &src)?;
    let failed = |e: libloading::Error| EmulationBuildError::Failed(e.to_string());
    // SAFETY: the library was just built from the kernel source and the emulation driver; its
    // initialisers only construct empty globals.
    let lib = unsafe { libloading::Library::new(&so) }.map_err(failed)?;
    // SAFETY: `hs_cpu_launch` is defined by the generated wrappers with exactly this signature.
    let launch = unsafe { lib.get::<LaunchFn>(b"hs_cpu_launch") }
        .map(|f| *f)
        .map_err(failed)?;
    Ok(Emu { _lib: lib, launch })
}

//! Compiles the WGSL compute shaders in `shaders/` to SPIR-V with naga (pure Rust: no system tool
//! is needed on the machine that builds the crate). The SPIR-V lands in `OUT_DIR` and is embedded
//! by `src/shaders.rs`; `tests/spirv_val.rs` checks it with `spirv-val`.
//!
//! `gather.wgsl` is a template: the host pool and the device pool are each bound as `CHUNKS`
//! windows of at most `maxStorageBufferRange` bytes, so pools larger than one binding work. The
//! script generates one variant with a single window per pool and one per entry of [`CHUNKS`].

use std::fmt::Write as _;
use std::path::Path;

/// Windows per pool of the chunked gather variants (keep in sync with `src/shaders.rs`).
const CHUNKS: [usize; 2] = [8, 32];

fn gather_source(template: &str, chunks: usize) -> String {
    let mut decl = String::new();
    let mut load = String::from("fn load_host(u: u32) -> vec4<u32> {\n");
    let mut store = String::from("fn store_dev(u: u32, v: vec4<u32>) {\n");
    if chunks == 1 {
        decl.push_str(
            "@group(0) @binding(4) var<storage, read> host0: array<vec4<u32>>;\n\
             @group(0) @binding(5) var<storage, read_write> dev0: array<vec4<u32>>;\n",
        );
        load.push_str("    return host0[u];\n}\n");
        store.push_str("    dev0[u] = v;\n}\n");
    } else {
        load.push_str("    let o = u & pc.chunk_mask;\n    switch (u >> pc.chunk_shift) {\n");
        store.push_str("    let o = u & pc.chunk_mask;\n    switch (u >> pc.chunk_shift) {\n");
        for c in 0..chunks {
            let _ = writeln!(
                decl,
                "@group(0) @binding({}) var<storage, read> host{c}: array<vec4<u32>>;",
                4 + c
            );
            let _ = writeln!(
                decl,
                "@group(0) @binding({}) var<storage, read_write> dev{c}: array<vec4<u32>>;",
                4 + chunks + c
            );
            let _ = writeln!(load, "        case {c}u: {{ return host{c}[o]; }}");
            let _ = writeln!(store, "        case {c}u: {{ dev{c}[o] = v; }}");
        }
        load.push_str("        default: { return vec4<u32>(0u); }\n    }\n}\n");
        store.push_str("        default: {}\n    }\n}\n");
    }
    template
        .replace("//@POOL_BINDINGS", &decl)
        .replace("//@POOL_ACCESS", &(load + &store))
}

fn compile(name: &str, source: &str, out_dir: &Path) {
    let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| {
        panic!("{name}: WGSL parse error:\n{}", e.emit_to_string(source));
    });
    // Barriers sit in control flow that is uniform per workgroup by construction (values read
    // once and broadcast), which WGSL's static analysis cannot prove; every other check stays on.
    let flags =
        naga::valid::ValidationFlags::all() - naga::valid::ValidationFlags::CONTROL_FLOW_UNIFORMITY;
    let info = naga::valid::Validator::new(flags, naga::valid::Capabilities::IMMEDIATES)
        .validate(&module)
        .unwrap_or_else(|e| {
            panic!("{name}: validation error:\n{}", e.emit_to_string(source));
        });
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        flags: naga::back::spv::WriterFlags::empty(),
        // Use the WGSL @group/@binding numbers as they are.
        fake_missing_bindings: true,
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::None,
        force_loop_bounding: false,
        // Every index is validated on the host before a dispatch; divisors are never zero.
        bounds_check_policies: naga::proc::BoundsCheckPolicies::default(),
        emit_int_div_checks: false,
        ..Default::default()
    };
    let pipeline = naga::back::spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&pipeline))
        .unwrap_or_else(|e| panic!("{name}: SPIR-V generation failed: {e}"));
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(out_dir.join(format!("{name}.spv")), bytes).expect("write SPIR-V");
}

fn main() {
    let out_dir = std::env::var_os("OUT_DIR").expect("OUT_DIR");
    let out_dir = Path::new(&out_dir);
    let dir = Path::new("shaders");
    println!("cargo:rerun-if-changed=shaders");
    let common = std::fs::read_to_string(dir.join("common.wgsl")).expect("common.wgsl");
    for name in [
        "remap",
        "slot_mapping",
        "invalidate",
        "resolve_prep",
        "resolve",
    ] {
        let src = std::fs::read_to_string(dir.join(format!("{name}.wgsl"))).expect("shader");
        compile(name, &format!("{common}\n{src}"), out_dir);
    }
    let gather = std::fs::read_to_string(dir.join("gather.wgsl")).expect("gather.wgsl");
    let gather = format!("{common}\n{gather}");
    compile("gather_1", &gather_source(&gather, 1), out_dir);
    for c in CHUNKS {
        compile(&format!("gather_{c}"), &gather_source(&gather, c), out_dir);
    }
}

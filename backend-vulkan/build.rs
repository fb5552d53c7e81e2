//! Compiles the WGSL compute shaders in `shaders/` to SPIR-V with naga (pure Rust: no system tool
//! is needed on the machine that builds the crate). The SPIR-V lands in `OUT_DIR` and is embedded
//! by `src/shaders.rs`; `tests/spirv_val.rs` checks it with `spirv-val`.
//!
//! A shader declares its storage buffers as `//@read NAME: TYPE` and `//@read_write NAME: TYPE`
//! lines, in the order the backend binds them (`src/shaders.rs`); the script writes the
//! declarations ([`expand_bindings`]): group 0, bindings numbered from 0 in that order through
//! the whole assembled source (the resolvers' own bindings follow `resolve_common.wgsl`'s), the
//! push constants `pc: Params` before the first. The shaders that run one invocation per item
//! define `items()` and `item(i)` and get their entry point from `per_item.wgsl`.
//!
//! `gather.wgsl`, `gather_per_entry.wgsl`, `copy.wgsl` and `indexer_backup.wgsl` are templates
//! over two pools, A (read) and B (written), each bound after the shader's own buffers as
//! `WINDOWS` storage buffers of one window each, so pools larger than one binding work: the
//! script generates one variant per entry of [`WINDOWS`]. The 1-window variant binds each pool
//! whole and needs no window arithmetic.

use std::fmt::Write as _;
use std::path::Path;

/// Windows per pool of the templated variants (keep in sync with `Windows` in `src/shaders.rs`).
const WINDOWS: [usize; 4] = [1, 8, 12, 32];

/// A binding directive of a shader source: the declaration it stands for (`NAME: TYPE`) and its
/// access mode, or `None` for any other line.
fn directive(line: &str) -> Option<(&'static str, &str)> {
    let line = line.trim_start();
    if let Some(decl) = line.strip_prefix("//@read_write ") {
        Some(("read_write", decl))
    } else {
        line.strip_prefix("//@read ").map(|decl| ("read", decl))
    }
}

/// The storage buffers `source` declares by directive (module docs).
fn binding_count(source: &str) -> usize {
    source.lines().filter_map(directive).count()
}

/// `source` with its binding directives written out as declarations (module docs).
fn expand_bindings(source: &str) -> String {
    let mut out = String::with_capacity(source.len() + 1024);
    let mut binding = 0;
    for line in source.lines() {
        match directive(line) {
            Some((access, decl)) => {
                if binding == 0 {
                    out.push_str("var<immediate> pc: Params;\n");
                }
                let _ = writeln!(
                    out,
                    "@group(0) @binding({binding}) var<storage, {access}> {decl};"
                );
                binding += 1;
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// The template with its pool bindings (after the template's own) and access functions filled
/// in; the pools are arrays of `word` (`vec4<u32>`, or `u32` for the 4-byte-word variant), which
/// the template names `Word`.
fn pooled_source(template: &str, windows: usize, word: &str) -> String {
    let first = binding_count(template);
    let mut decl = format!("alias Word = {word};\n");
    let mut access = String::new();
    for c in 0..windows {
        let _ = writeln!(
            decl,
            "@group(0) @binding({}) var<storage, read> a{c}: array<Word>;",
            first + c
        );
    }
    for c in 0..windows {
        let _ = writeln!(
            decl,
            "@group(0) @binding({}) var<storage, read_write> b{c}: array<Word>;",
            first + windows + c
        );
    }
    if windows == 1 {
        access.push_str(
            "fn in_a(u: u32) -> bool {\n    return true;\n}\n\
             fn in_b(u: u32) -> bool {\n    return true;\n}\n\
             fn load_a(u: u32) -> Word {\n    return a0[u];\n}\n\
             fn store_b(u: u32, v: Word) {\n    b0[u] = v;\n}\n",
        );
    } else {
        let _ = write!(
            access,
            "const WINDOWS: u32 = {windows}u;\n\
             fn in_a(u: u32) -> bool {{\n    return (u >> pc.chunk_shift) - pc.a_base < WINDOWS;\n}}\n\
             fn in_b(u: u32) -> bool {{\n    return (u >> pc.chunk_shift) - pc.b_base < WINDOWS;\n}}\n"
        );
        access.push_str(
            "fn load_a(u: u32) -> Word {\n    let o = u & pc.chunk_mask;\n    \
             switch ((u >> pc.chunk_shift) - pc.a_base) {\n",
        );
        for c in 0..windows {
            let _ = writeln!(access, "        case {c}u: {{ return a{c}[o]; }}");
        }
        access.push_str("        default: { return Word(0u); }\n    }\n}\n");
        access.push_str(
            "fn store_b(u: u32, v: Word) {\n    let o = u & pc.chunk_mask;\n    \
             switch ((u >> pc.chunk_shift) - pc.b_base) {\n",
        );
        for c in 0..windows {
            let _ = writeln!(access, "        case {c}u: {{ b{c}[o] = v; }}");
        }
        access.push_str("        default: {}\n    }\n}\n");
    }
    template
        .replace("//@POOL_BINDINGS", &decl)
        .replace("//@POOL_ACCESS", &access)
}

/// The resolver's scan on devices without subgroup arithmetic.
const PLAIN_SCAN: &str = "fn scan(lid: u32, f: u32) -> u32 {\n    return scan_barriers(lid, f);\n}";

/// The resolver's scan with subgroup arithmetic: an inclusive add inside each subgroup, one
/// invocation scans the subgroup totals, two barriers in all (the plain scan takes 16). It needs
/// subgroups that are consecutive runs of `local_invocation_index`, as every known driver makes
/// them; the entry point checks that once and otherwise falls back to the plain scan.
const SUBGROUP_SCAN: &str = "
var<private> sg_inv: u32;
var<private> sg_size: u32;
var<private> sg_idx: u32;
var<private> sg_count: u32;
// Per subgroup: its total, then the total of the subgroups before it.
var<workgroup> sg_sums: array<u32, 256>;
// 1 when every invocation's lid = subgroup_id * subgroup_size + subgroup_invocation_id.
var<workgroup> sg_linear: atomic<u32>;

fn scan(lid: u32, f: u32) -> u32 {
    if (atomicLoad(&sg_linear) == 0u) {
        return scan_barriers(lid, f);
    }
    let x = subgroupInclusiveAdd(f);
    if (sg_inv == sg_size - 1u) {
        sg_sums[sg_idx] = x;
    }
    workgroupBarrier();
    if (lid == 0u) {
        var acc = 0u;
        for (var i = 0u; i < sg_count; i = i + 1u) {
            let v = sg_sums[i];
            sg_sums[i] = acc;
            acc = acc + v;
        }
        sc[W - 1u] = acc;
    }
    workgroupBarrier();
    return x + sg_sums[sg_idx];
}
";

/// The one-dispatch resolver's scan on devices without subgroup arithmetic.
const WG_PLAIN_SCAN: &str = "fn scan(f: u32) -> u32 {\n    return scan_plain(f);\n}";

/// The one-dispatch resolver's scan with subgroup arithmetic: an inclusive add inside each
/// subgroup, then every invocation sums the subgroup totals before its own (one barrier; the
/// totals alternate between two buffers so consecutive scans need no second barrier). It orders
/// invocations by (subgroup, lane), which `//@WG_SG_INIT` makes their place `vl`, and needs full
/// subgroups; otherwise the entry point keeps `vl = lid` and the plain scan.
const WG_SUBGROUP_SCAN: &str = "
var<private> sg_inv: u32;
var<private> sg_size: u32;
var<private> sg_idx: u32;
var<private> sg_count: u32;
var<private> use_sg: bool;
var<private> scan_phase: u32;
var<workgroup> sg_sums: array<u32, 256>;

fn scan(f: u32) -> u32 {
    if (!use_sg) {
        return scan_plain(f);
    }
    let b = (scan_phase & 1u) * 128u;
    scan_phase = scan_phase + 1u;
    let incl = subgroupInclusiveAdd(f);
    if (sg_inv == sg_size - 1u) {
        sg_sums[b + sg_idx] = incl;
    }
    workgroupBarrier();
    var before = 0u;
    var sum = 0u;
    for (var i = 0u; i < sg_count; i = i + 1u) {
        let x = sg_sums[b + i];
        if (i < sg_idx) {
            before = before + x;
        }
        sum = sum + x;
    }
    scan_total = sum;
    return before + incl - f;
}
";

/// Start of the one-dispatch resolver's subgroup variant: full subgroups (at most 128) order the
/// invocations by (subgroup, lane).
const WG_SUBGROUP_INIT: &str = "sg_inv = sg_inv_in;
    sg_size = sg_size_in;
    sg_idx = sg_idx_in;
    sg_count = sg_count_in;
    scan_phase = 0u;
    use_sg = sg_size * sg_count == W && sg_count <= 128u;
    if (use_sg) {
        vl = sg_idx * sg_size + sg_inv;
    }";

/// Entry-point parameters of the subgroup variant.
const SUBGROUP_PARAMS: &str = "@builtin(subgroup_invocation_id) sg_inv_in: u32,
    @builtin(subgroup_size) sg_size_in: u32,
    @builtin(subgroup_id) sg_idx_in: u32,
    @builtin(num_subgroups) sg_count_in: u32,";

/// Start of the subgroup variant's entry point: the subgroup layout check.
const SUBGROUP_INIT: &str = "sg_inv = sg_inv_in;
    sg_size = sg_size_in;
    sg_idx = sg_idx_in;
    sg_count = sg_count_in;
    if (lid == 0u) {
        atomicStore(&sg_linear, 1u);
    }
    workgroupBarrier();
    if (lid != sg_idx * sg_size + sg_inv || W % sg_size != 0u || sg_count > 256u) {
        atomicStore(&sg_linear, 0u);
    }
    workgroupBarrier();";

fn compile(name: &str, source: &str, out_dir: &Path) {
    let source = &expand_bindings(source);
    let module = naga::front::wgsl::parse_str(source).unwrap_or_else(|e| {
        panic!("{name}: WGSL parse error:\n{}", e.emit_to_string(source));
    });
    // Barriers sit in control flow that is uniform per workgroup by construction (values read
    // once and broadcast), which WGSL's static analysis cannot prove; every other check stays on.
    let flags =
        naga::valid::ValidationFlags::all() - naga::valid::ValidationFlags::CONTROL_FLOW_UNIFORMITY;
    let caps = naga::valid::Capabilities::IMMEDIATES | naga::valid::Capabilities::SUBGROUP;
    let info = naga::valid::Validator::new(flags, caps)
        .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
        .subgroup_operations(
            naga::valid::SubgroupOperationSet::BASIC
                | naga::valid::SubgroupOperationSet::ARITHMETIC,
        )
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
    // The entry point of the shaders that define `items` and `item` (one invocation per item).
    let per_item = std::fs::read_to_string(dir.join("per_item.wgsl")).expect("per_item.wgsl");
    for (name, entry) in [
        ("remap", ""),
        ("slot_mapping", per_item.as_str()),
        ("invalidate", per_item.as_str()),
        ("resolve_prep", per_item.as_str()),
        ("resolve_order", per_item.as_str()),
        ("resolve_stats", ""),
        ("table_write", per_item.as_str()),
        ("hot_reset", per_item.as_str()),
    ] {
        let src = std::fs::read_to_string(dir.join(format!("{name}.wgsl"))).expect("shader");
        compile(name, &format!("{common}\n{src}\n{entry}"), out_dir);
    }
    // Both resolvers: the shared helpers, then their common parameters and bindings.
    let resolve_common =
        std::fs::read_to_string(dir.join("resolve_common.wgsl")).expect("resolve_common.wgsl");
    let common_resolve = format!("{common}\n{resolve_common}");
    let resolve = std::fs::read_to_string(dir.join("resolve.wgsl")).expect("resolve.wgsl");
    let plain = resolve
        .replace("//@SCAN", PLAIN_SCAN)
        .replace("//@SG_PARAMS", "")
        .replace("//@SG_INIT", "");
    compile("resolve", &format!("{common_resolve}\n{plain}"), out_dir);
    let subgroup = resolve
        .replace("//@SCAN", SUBGROUP_SCAN)
        .replace("//@SG_PARAMS", SUBGROUP_PARAMS)
        .replace("//@SG_INIT", SUBGROUP_INIT);
    compile(
        "resolve_sg",
        &format!("{common_resolve}\n{subgroup}"),
        out_dir,
    );
    let wg = std::fs::read_to_string(dir.join("resolve_wg.wgsl")).expect("resolve_wg.wgsl");
    // (module suffix, hash-table capacity): keep in sync with `Shader::ResolveWg*`.
    for (suffix, capacity) in [("", 2560), ("_large", 4096)] {
        let wg = wg.replace(
            "const TC: u32 = 2560u;",
            &format!("const TC: u32 = {capacity}u;"),
        );
        let plain = wg
            .replace("//@SCAN", WG_PLAIN_SCAN)
            .replace("//@SG_PARAMS", "")
            .replace("//@SG_INIT", "");
        compile(
            &format!("resolve_wg{suffix}"),
            &format!("{common_resolve}\n{plain}"),
            out_dir,
        );
        let subgroup = wg
            .replace("//@SCAN", WG_SUBGROUP_SCAN)
            .replace("//@SG_PARAMS", SUBGROUP_PARAMS)
            .replace("//@SG_INIT", WG_SUBGROUP_INIT);
        compile(
            &format!("resolve_wg{suffix}_sg"),
            &format!("{common_resolve}\n{subgroup}"),
            out_dir,
        );
    }
    // (template, module stem, pool word)
    // Where rows lie in a pool: appended to the templates that locate rows.
    let row_layout = std::fs::read_to_string(dir.join("row_layout.wgsl")).expect("row_layout.wgsl");
    for (name, stem, word) in [
        ("gather", "gather", "vec4<u32>"),
        ("gather_per_entry", "gather_per_entry", "vec4<u32>"),
        ("gather_per_entry", "gather_per_entry_words", "u32"),
        ("copy", "copy", "vec4<u32>"),
        ("copy", "copyw", "u32"),
        ("indexer_backup", "indexer_backup", "u32"),
    ] {
        let src = std::fs::read_to_string(dir.join(format!("{name}.wgsl"))).expect("template");
        let rows = if name == "copy" {
            ""
        } else {
            row_layout.as_str()
        };
        let src = format!("{common}\n{src}\n{rows}");
        for w in WINDOWS {
            compile(
                &format!("{stem}_{w}"),
                &pooled_source(&src, w, word),
                out_dir,
            );
        }
    }
}

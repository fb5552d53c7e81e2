//! Validates every embedded SPIR-V module with `spirv-val` (Debian/Ubuntu package
//! `spirv-tools`) for a Vulkan 1.2 target. Without the tool the check says loudly that it is
//! skipped; with `HISPARSE_REQUIRE_SPIRV_VAL=1` (as CI sets it) a missing tool is a failure.

use std::process::Command;

#[test]
fn embedded_spirv_passes_spirv_val() {
    let required = hisparse_conformance::check::flag_set("HISPARSE_REQUIRE_SPIRV_VAL");
    if Command::new("spirv-val").arg("--version").output().is_err() {
        assert!(
            !required,
            "spirv-val not found and HISPARSE_REQUIRE_SPIRV_VAL=1: install spirv-tools"
        );
        // Straight to stderr, not through `eprintln!`: libtest captures a passing test's
        // `eprintln!` output, which would hide the skip behind `... ok`.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED: spirv-val not found (install spirv-tools); the embedded SPIR-V was not validated"
        );
        return;
    }
    let dir = std::env::temp_dir().join(format!("hisparse-spirv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut checked = 0;
    for (name, bytes) in hisparse_backend_vulkan::spirv_modules() {
        let path = dir.join(format!("{name}.spv"));
        std::fs::write(&path, bytes).expect("write SPIR-V");
        let out = Command::new("spirv-val")
            .args(["--target-env", "vulkan1.2"])
            .arg(&path)
            .output()
            .unwrap_or_else(|e| panic!("cannot run spirv-val ({e}); install spirv-tools"));
        assert!(
            out.status.success(),
            "spirv-val rejects {name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    // 13 single shaders plus 4 window variants each of the three gathers and the two copies.
    assert_eq!(checked, 38, "every shader is checked");
}

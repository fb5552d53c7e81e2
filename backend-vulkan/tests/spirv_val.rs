//! Validates every embedded SPIR-V module with `spirv-val` (Debian/Ubuntu package
//! `spirv-tools`) for a Vulkan 1.2 target. The tool is required: install it, or set
//! `HISPARSE_SKIP_SPIRV_VAL=1` to skip this check explicitly (it then reports itself skipped).

use std::process::Command;

#[test]
fn embedded_spirv_passes_spirv_val() {
    if std::env::var("HISPARSE_SKIP_SPIRV_VAL").is_ok_and(|v| v.trim() == "1") {
        eprintln!("SKIPPED: HISPARSE_SKIP_SPIRV_VAL=1");
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
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run spirv-val ({e}); install spirv-tools or set \
                     HISPARSE_SKIP_SPIRV_VAL=1"
                )
            });
        assert!(
            out.status.success(),
            "spirv-val rejects {name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(checked, 8, "every shader is checked");
}

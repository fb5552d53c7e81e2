//! Regenerates `include/hisparse.h` from the crate's sources with cbindgen (settings in
//! `cbindgen.toml`). `--check` compares instead of writing and fails on a difference.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = dir.join("include").join("hisparse.h");
    let check = std::env::args().any(|a| a == "--check");
    let config = match cbindgen::Config::from_file(dir.join("cbindgen.toml")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hisparse-capi-header: cbindgen.toml: {e}");
            return ExitCode::FAILURE;
        }
    };
    let bindings = match cbindgen::generate_with_config(dir, config) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("hisparse-capi-header: cbindgen failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut text = Vec::new();
    bindings.write(&mut text);
    if check {
        let current = std::fs::read(&header).unwrap_or_default();
        if current != text {
            eprintln!(
                "{} is stale: regenerate it with `cargo run -p hisparse-capi --features header --bin hisparse-capi-header`",
                header.display()
            );
            return ExitCode::FAILURE;
        }
        println!("{} is up to date", header.display());
        return ExitCode::SUCCESS;
    }
    if let Err(e) = std::fs::write(&header, &text) {
        eprintln!("hisparse-capi-header: writing {}: {e}", header.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", header.display());
    ExitCode::SUCCESS
}

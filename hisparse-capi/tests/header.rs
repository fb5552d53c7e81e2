//! `include/hisparse.h` is what cbindgen generates from the crate's sources today (settings in
//! `cbindgen.toml`): the status codes, enums, structs and entry points of the header are the Rust
//! ones, written once. A change to the sources without the regenerated header fails here; regenerate
//! it with `cargo run -p hisparse-capi --features header --bin hisparse-capi-header`.

use std::path::Path;

#[test]
fn the_committed_header_is_what_cbindgen_generates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::generate_with_config(dir, config).expect("cbindgen");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let committed = std::fs::read(dir.join("include").join("hisparse.h")).expect("hisparse.h");
    if committed != generated {
        let (c, g) = (
            String::from_utf8_lossy(&committed),
            String::from_utf8_lossy(&generated),
        );
        let line = c
            .lines()
            .zip(g.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| c.lines().count().min(g.lines().count()));
        panic!(
            "include/hisparse.h is stale from line {}: regenerate it with \
             `cargo run -p hisparse-capi --features header --bin hisparse-capi-header`",
            line + 1
        );
    }
}

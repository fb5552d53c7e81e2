//! The data-plane contract: `device`, `ops` and `error` (under `src/data_plane/`) import nothing
//! of the planning side, so a backend depends on descriptors and slices alone. The compiler
//! cannot say which way imports point inside one crate; this test reads the sources and does.

use std::fs;
use std::path::{Path, PathBuf};

/// The planning side's modules: none may be named from the data plane.
const PLANNING: [&str; 7] = [
    "model",
    "presets",
    "config",
    "layout",
    "pool",
    "coordinator",
    "wire",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The places in `source` (comments aside) that name a planning module.
fn planning_uses(source: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for module in PLANNING {
            let named = [
                format!("crate::{module}"),
                format!("hisparse_core::{module}"),
                format!("crate::{{{module}"),
            ];
            // `super::super::super` from `data_plane/ops/<op>/` leaves the data plane.
            if named.iter().any(|p| code.contains(p.as_str()))
                || code.contains("super::super::super")
            {
                found.push((n + 1, line.trim().to_owned()));
                break;
            }
        }
    }
    found
}

#[test]
fn the_data_plane_names_nothing_of_the_planning_side() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/data_plane");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(
        files.len() > 20,
        "only {} files under {root:?}",
        files.len()
    );
    let mut offences = Vec::new();
    for file in &files {
        for (line, code) in planning_uses(&fs::read_to_string(file).unwrap()) {
            offences.push(format!("{}:{line}: {code}", file.display()));
        }
    }
    assert!(
        offences.is_empty(),
        "the data plane must not import the planning side:\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_check_sees_an_import_of_the_planning_side() {
    assert_eq!(
        planning_uses("use crate::layout::KvCacheConfig;\n/// [`crate::pool`]\nuse crate::ops;"),
        [(1, "use crate::layout::KvCacheConfig;".to_owned())]
    );
    assert_eq!(planning_uses("use crate::{pool::BlockPool, ops};").len(), 1);
}

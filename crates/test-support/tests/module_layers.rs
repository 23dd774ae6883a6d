//! No module of a workspace crate uses a module that uses it, directly or around a cycle, so a
//! reader follows each crate from the bottom up (docs/design.md). Every crate under `crates/`
//! is checked, so a new one is too.
//!
//! Cycles inside one directory are allowed only for the directories listed in
//! [`CYCLES_WITHIN`]: one module split into files for reading (`use super::*`). An entry whose
//! directory has no cycle any more must go, so the list only gets shorter (issue 41).

use std::path::Path;

use sliver_test_support::layers::module_cycles;

/// Directories, as `crate/directory` (under `src`), whose files may form a cycle. Not
/// `engine/meta`: its modules are layered (table numbers in `tables`, the layout the pager and
/// the root file share in `layout`; RFC 0005).
const CYCLES_WITHIN: &[&str] = &[
    "engine/engine",
    "server/api",
    "server/array",
    "server/connection",
    "server/target",
];

#[test]
fn no_module_of_a_workspace_crate_uses_one_that_uses_it() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names: Vec<String> = std::fs::read_dir(&crates)
        .expect("the crates directory")
        .filter_map(|entry| {
            let entry = entry.ok()?;
            entry
                .path()
                .join("src")
                .is_dir()
                .then(|| entry.file_name().to_string_lossy().into_owned())
        })
        .collect();
    names.sort();
    assert!(
        names.len() >= 12 && names.iter().any(|n| n == "scsi"),
        "the crates were not found: {names:?}"
    );
    let mut report = Vec::new();
    let mut cyclic_directories = Vec::new();
    for name in &names {
        match module_cycles(&crates.join(name).join("src")) {
            Ok(cycles) => {
                for cycle in cycles {
                    let within = cycle.directory.map(|d| format!("{name}/{d}"));
                    match within {
                        Some(dir) if CYCLES_WITHIN.contains(&dir.as_str()) => {
                            cyclic_directories.push(dir)
                        }
                        Some(dir) => report.push(format!("{dir} (not listed): {}", cycle.report)),
                        None => report.push(format!("{name}: {}", cycle.report)),
                    }
                }
            }
            Err(e) => report.push(format!("{name}: {e}")),
        }
    }
    for dir in CYCLES_WITHIN {
        if !cyclic_directories.iter().any(|d| d == dir) {
            report.push(format!(
                "{dir}: no cycle any more: remove it from CYCLES_WITHIN"
            ));
        }
    }
    assert!(report.is_empty(), "module cycles:\n{}", report.join("\n"));
}

//! No module of a workspace crate uses a module that uses it, directly or around a cycle, so a
//! reader follows each crate from the bottom up (docs/design.md). Every crate under `crates/`
//! is checked, so a new one is too.

use std::path::Path;

use sliver_test_support::layers::module_cycles;

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
    for name in &names {
        match module_cycles(&crates.join(name).join("src")) {
            Ok(cycles) => report.extend(cycles.into_iter().map(|c| format!("{name}: {c}"))),
            Err(e) => report.push(format!("{name}: {e}")),
        }
    }
    assert!(report.is_empty(), "module cycles:\n{}", report.join("\n"));
}

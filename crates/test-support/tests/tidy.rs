//! A ratchet on size (TigerBeetle's tidy, issue 41): no non-test source file over
//! [`FILE_LINES`] lines and no function over [`FUNCTION_LINES`], except those listed below
//! with their size today. A listed one may shrink but not grow; once it is under the limit
//! its entry must go, so the lists only get shorter. Sizes are measured by
//! `sliver_test_support::tidy` (non-test code, as `cargo fmt` leaves it).

use std::collections::BTreeMap;
use std::path::Path;

use sliver_test_support::tidy::{measure, source_files};

const FILE_LINES: usize = 1_000;
const FUNCTION_LINES: usize = 150;

/// Files over the limit, with their lines when listed.
const LONG_FILES: &[(&str, usize)] = &[
    ("engine/src/meta/pager.rs", 1004),
    ("initiator/src/session.rs", 1275),
    ("iscsi/src/connection.rs", 1397),
    ("iscsi/src/pdu.rs", 1086),
    ("replica/src/hydrate.rs", 1313),
    ("torture/src/load.rs", 1443),
];

/// Functions over the limit (`file name`), with their lines when listed.
const LONG_FUNCTIONS: &[(&str, usize)] = &[
    ("engine/src/engine/checkpointing.rs checkpoint_locked", 163),
    ("engine/src/engine/gc.rs collect_one", 170),
    ("replica/src/restore.rs restore", 284),
    ("torture/src/io.rs build", 193),
    ("torture/src/load.rs run", 276),
    ("torture/src/verify.rs verify", 159),
];

#[test]
fn no_file_or_function_grows_past_the_limits() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = source_files(&root).expect("the workspace's sources");
    assert!(
        files.len() > 100,
        "sources not found under {}",
        root.display()
    );
    let mut long = BTreeMap::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let file = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        for size in measure(&file, &text) {
            let limit = if size.name.is_empty() {
                FILE_LINES
            } else {
                FUNCTION_LINES
            };
            if size.lines > limit {
                let entry = long.entry(size.key()).or_insert(0);
                *entry = size.lines.max(*entry);
            }
        }
    }
    let listed: BTreeMap<&str, usize> = LONG_FILES.iter().chain(LONG_FUNCTIONS).copied().collect();
    let mut problems = Vec::new();
    for (key, &lines) in &long {
        match listed.get(key.as_str()) {
            None => problems.push(format!("{key}: {lines} lines, over the limit (split it)")),
            Some(&allowed) if lines > allowed => problems.push(format!(
                "{key}: {lines} lines, grew past the {allowed} it is listed with"
            )),
            _ => {}
        }
    }
    for key in listed.keys() {
        if !long.contains_key(*key) {
            problems.push(format!(
                "{key}: under the limit now (or gone): remove it from the list"
            ));
        }
    }
    assert!(problems.is_empty(), "tidy:\n{}", problems.join("\n"));
}

//! Shared by the integration tests: the `sliver` binary they run, and what they ask of a run's
//! report.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// `<target>/debug/sliver`, from a test's path `<target>/debug/deps/NAME-HASH`. Cargo
/// does not build other packages' binaries for integration tests, so this always runs
/// `cargo build -p sliver` (a no-op when fresh): a stale binary would torture old code.
pub fn sliver_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("tests live in <target>/<profile>/deps")
        .to_path_buf();
    let bin = profile_dir.join("sliver");
    {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "sliver"]);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        if let Some(target) = profile_dir.parent() {
            cmd.env("CARGO_TARGET_DIR", target);
        }
        let status = cmd
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build -p sliver");
        assert!(status.success(), "cargo build -p sliver failed");
    }
    assert!(bin.is_file(), "no sliver binary at {}", bin.display());
    bin
}

/// Every command kind in `kinds` completed at least once (`completed`: a report's count by kind).
#[track_caller]
pub fn assert_each_completed(completed: &BTreeMap<String, u64>, kinds: &[&str]) {
    for kind in kinds {
        assert!(
            completed.get(*kind).copied().unwrap_or(0) > 0,
            "no {kind} completed"
        );
    }
}

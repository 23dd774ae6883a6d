//! The engine's data reduction and copy offload, judged through iSCSI by QEMU's block
//! driver (qemu-img, qemu-io from Debian's qemu-utils and qemu-block-extra).

use sliver_server::array::{ArrayOptions, ANY_HOST};
use sliver_test_support::target::{Running, Start};
use std::process::Command;

const TARGET: &str = "iqn.2026-11.test.sliver:engine";
const MIB: u64 = 1 << 20;
/// Data written per step: big enough that metadata noise is small next to it.
const DATA: u64 = 128 * MIB;

fn start(volumes: &[&str]) -> Running {
    let options = ArrayOptions {
        capacity_bytes: Some(4 << 30),
        ..ArrayOptions::default()
    };
    Start::new(TARGET)
        .options(options)
        .thread_name("sliver-engine-iscsi")
        .run(
            |array| {
                for (lun, name) in volumes.iter().enumerate() {
                    array.create_volume(name, 1 << 30, 512).unwrap();
                    array.connect(name, ANY_HOST, Some(lun as u64)).unwrap();
                }
            },
            |_| {},
        )
}

fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool} must be installed (qemu-utils): {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "$ {tool} {}\n{text}", args.join(" "));
    text
}

/// Incompressible data in a file, for qemu-img to copy onto LUNs.
fn random_file(dir: &std::path::Path, bytes: u64) -> String {
    let path = dir.join("random.img");
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let data: Vec<u8> = (0..bytes)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(&path, data).unwrap();
    path.to_string_lossy().into_owned()
}

fn live(r: &Running) -> u64 {
    r.array.engine_space().live_bytes
}

#[test]
fn identical_data_is_stored_once_zeros_never_and_discard_returns_space() {
    let r = start(&["a", "b"]);
    let file = random_file(r.dir(), DATA);
    let before = live(&r);
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", &file, &r.url(0)],
    );
    let one_copy = live(&r) - before;
    // Incompressible: stored raw, plus 40 bytes of record per 4 KiB chunk.
    assert!(
        (DATA..=DATA + DATA / 50).contains(&one_copy),
        "first copy took {one_copy}"
    );

    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", &file, &r.url(1)],
    );
    let second = live(&r) - before - one_copy;
    assert!(
        second < MIB,
        "the same data on another volume took {second} bytes"
    );
    let space = r.array.engine_space();
    assert!(space.data_reduction > 1.9, "{space:?}");

    // Writing zero data (not WRITE SAME: real zero-filled writes) stores nothing.
    let zeros = live(&r);
    run(
        "qemu-io",
        &[
            "-f",
            "raw",
            "-c",
            &format!("write -P 0 {DATA} {DATA}"),
            &r.url(0),
        ],
    );
    assert!(live(&r) - zeros < MIB / 4);

    // Discarding one copy frees nothing (the other still references it); both, all of it.
    run(
        "qemu-io",
        &["-f", "raw", "-c", &format!("discard 0 {DATA}"), &r.url(0)],
    );
    assert!(live(&r) >= one_copy);
    let used_before = r.array.engine_space().physical_used_bytes;
    run(
        "qemu-io",
        &["-f", "raw", "-c", &format!("discard 0 {DATA}"), &r.url(1)],
    );
    assert!(live(&r) - before < MIB, "unreferenced after both discards");
    r.array.engine().collect_garbage(0.999).unwrap();
    let used_after = r.array.engine_space().physical_used_bytes;
    assert!(
        used_before - used_after >= DATA - 8 * MIB,
        "collection returned {} of {DATA} bytes",
        used_before - used_after
    );
    let map = run(
        "qemu-img",
        &["map", "--output=json", "-f", "raw", &r.url(1)],
    );
    assert!(!map.contains("\"data\": true"), "{map}");
}

#[test]
fn qemu_copy_offload_shares_data_instead_of_copying_it() {
    let r = start(&["src", "dst"]);
    let file = random_file(r.dir(), DATA);
    run(
        "qemu-img",
        &["convert", "-n", "-f", "raw", "-O", "raw", &file, &r.url(0)],
    );
    let before = live(&r);
    // -C: copy offloading (EXTENDED COPY) required; qemu-img fails rather than falling back.
    run(
        "qemu-img",
        &[
            "convert",
            "-C",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            &r.url(0),
            &r.url(1),
        ],
    );
    let grown = live(&r) - before;
    assert!(grown < MIB, "offloaded copy added {grown} bytes");
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &r.url(0), &r.url(1)],
    );
    let usage = r.array.unit("dst").unwrap().volume().space().unwrap();
    assert!(usage.mapped_bytes >= DATA);
    assert_eq!(
        usage.unique_bytes, 0,
        "everything dst holds is shared with src"
    );
    // The copy is visible in the VAAI counters, as esxtop's CLONE_RD / CLONE_WR show it.
    let src = r.array.unit("src").unwrap().stats().vaai;
    let dst = r.array.unit("dst").unwrap().stats().vaai;
    assert!(src.clone_read > 0 && src.clone_write == 0, "{src:?}");
    assert!(dst.clone_write > 0 && dst.clone_read == 0, "{dst:?}");
    assert_eq!(dst.cloned_bytes, DATA);
    assert_eq!(src.clone_failed + dst.clone_failed, 0);
}

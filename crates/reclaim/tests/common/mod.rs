//! Loop devices and mounts for the root-only tests, cleaned up by Drop even when a test fails.

#![allow(dead_code)]

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const MIB: u64 = 1 << 20;

/// These tests need root (loop devices, mount, FITRIM). Without it they fail loudly: a test
/// that silently passes would hide that nothing was checked.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test needs root (loop devices, mount, FITRIM); run `sudo cargo test -p sliver-reclaim` (CI runs as root)"
    );
}

pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e} (is it installed?)"));
    assert!(
        out.status.success(),
        "{cmd} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// A sparse image file attached to a loop device, formatted and mounted under a temp dir.
pub struct LoopFs {
    pub image: PathBuf,
    pub device: String,
    pub mount: PathBuf,
    mounted: bool,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// `fstype` is "ext4" or "xfs"; `before_mount` may tweak the loop device (sysfs).
    pub fn new(fstype: &str, size: u64, before_mount: impl FnOnce(&str)) -> Self {
        require_root();
        let dir = tempfile::tempdir().expect("temp dir");
        let image = dir.path().join(format!("{fstype}.img"));
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(size).unwrap();
        drop(file);
        let device = sh("losetup", &["--find", "--show", image.to_str().unwrap()]);
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        let mut me = Self {
            image,
            device,
            mount,
            mounted: false,
            _dir: dir,
        };
        match fstype {
            // No discard at mkfs, no lazy initialisation in the background: the image's
            // allocation must change only through what the test does.
            "ext4" => sh(
                "mkfs.ext4",
                &[
                    "-q",
                    "-F",
                    "-E",
                    "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
                    &me.device,
                ],
            ),
            "xfs" => sh("mkfs.xfs", &["-q", "-f", "-K", &me.device]),
            other => panic!("unsupported fstype {other}"),
        };
        before_mount(&me.device);
        sh("mount", &[&me.device, me.mount.to_str().unwrap()]);
        me.mounted = true;
        me
    }

    /// Bytes allocated to the backing image (st_blocks).
    pub fn image_allocated(&self) -> u64 {
        std::fs::metadata(&self.image).unwrap().blocks() * 512
    }

    /// Writes `size` bytes of non-zero data to `name` and makes it durable.
    pub fn write_file(&self, name: &str, size: u64) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.mount.join(name)).unwrap();
        let chunk: Vec<u8> = (0..MIB as usize).map(|i| (i % 251) as u8 + 1).collect();
        for _ in 0..size / MIB {
            f.write_all(&chunk).unwrap();
        }
        f.sync_all().unwrap();
        drop(f);
        self.sync();
    }

    pub fn remove_file(&self, name: &str) {
        std::fs::remove_file(self.mount.join(name)).unwrap();
        self.sync();
    }

    /// Makes freed blocks really free: a freeze/thaw cycle syncs, commits the journal and
    /// (XFS) waits until freed extents are no longer busy — XFS's FITRIM skips busy extents,
    /// which a plain sync does not clear at once.
    pub fn sync(&self) {
        let m = self.mount.to_str().unwrap();
        sh("fsfreeze", &["--freeze", m]);
        sh("fsfreeze", &["--unfreeze", m]);
    }

    /// statvfs f_bfree * f_frsize.
    pub fn free_bytes(&self) -> u64 {
        sliver_reclaim::fs::statvfs(&self.mount).unwrap().free_bytes
    }

    pub fn path(&self) -> &Path {
        &self.mount
    }
}

/// Removes loop device `dev` so that a later attach gets fresh queue limits (a test that set
/// discard_max_bytes to 0 must not leave a crippled device behind).
fn remove_loop_device(dev: &str) {
    let Some(n) = dev
        .strip_prefix("/dev/loop")
        .and_then(|n| n.parse::<libc::c_ulong>().ok())
    else {
        return;
    };
    let Ok(ctl) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")
    else {
        return;
    };
    const LOOP_CTL_REMOVE: libc::c_ulong = 0x4c81;
    for _ in 0..100 {
        // SAFETY: LOOP_CTL_REMOVE takes the device number by value.
        let r = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(&ctl),
                LOOP_CTL_REMOVE as _,
                n,
            )
        };
        if r == 0 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let name = self.device.trim_start_matches("/dev/");
        let crippled =
            std::fs::read_to_string(format!("/sys/block/{name}/queue/discard_max_bytes"))
                .map(|s| s.trim() == "0")
                .unwrap_or(false);
        if self.mounted {
            let m = self.mount.to_str().unwrap_or_default().to_owned();
            let ok = Command::new("umount").arg(&m).status().map(|s| s.success());
            if !matches!(ok, Ok(true)) {
                let _ = Command::new("umount").args(["-l", &m]).status();
            }
        }
        let _ = Command::new("losetup").args(["-d", &self.device]).status();
        if crippled {
            remove_loop_device(&self.device);
        }
    }
}

/// A tmpfs mounted under a temp dir.
pub struct Tmpfs {
    pub mount: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn new() -> Self {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("tmpfs");
        std::fs::create_dir(&mount).unwrap();
        sh(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                "size=16m",
                "none",
                mount.to_str().unwrap(),
            ],
        );
        Self { mount, _dir: dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let m = self.mount.to_str().unwrap_or_default().to_owned();
        if !matches!(
            Command::new("umount").arg(&m).status().map(|s| s.success()),
            Ok(true)
        ) {
            let _ = Command::new("umount").args(["-l", &m]).status();
        }
    }
}

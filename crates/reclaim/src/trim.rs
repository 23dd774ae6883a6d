//! One rate-limited FITRIM pass over a mounted file system.

use crate::fs::{self, Geometry, MountEntry, Window};
use crate::limiter::{Clock, Limiter, RateSpec};
use sliver_api_types::units::{human_bytes, human_rate};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A mounted file system ready for passes.
pub struct Target {
    pub path: PathBuf,
    pub mount: MountEntry,
    pub geometry: Geometry,
    pub window_bytes: u64,
    pub windows: Vec<Window>,
    pub min_extent: u64,
    /// The device's discard limits, when it is a block device.
    pub discard: Option<fs::DiscardLimits>,
    /// Count discarded bytes from XFS allocation group free space.
    pub xfs_accounting: bool,
    dir: File,
}

impl Target {
    /// Resolves `path` to its mount and checks that discard can work there at all.
    pub fn prepare(
        path: &Path,
        min_extent: Option<u64>,
        window: Option<u64>,
    ) -> Result<Self, String> {
        let mount = fs::find_mount(path)?;
        let discard = fs::discard_limits(mount.major, mount.minor);
        if let Some(d) = discard {
            if d.max_bytes == 0 {
                return Err(format!(
                    "{} ({}, mounted at {}) does not support discard \
                     (/sys/dev/block/{}:{}/queue/discard_max_bytes is 0): nothing can be reclaimed",
                    mount.source,
                    mount.fstype,
                    mount.mount_point.display(),
                    mount.major,
                    mount.minor
                ));
            }
        }
        let space = fs::statvfs(&mount.mount_point)?;
        let geometry = fs::geometry(&mount, space.total_bytes, space.block_size);
        let min_extent = match min_extent {
            Some(m) => m,
            None => discard
                .map(|d| d.granularity)
                .filter(|g| *g > 0)
                .unwrap_or(geometry.block_size),
        };
        let window_bytes = match window {
            Some(0) => return Err("--window must be positive".into()),
            Some(w) => w,
            None => fs::default_window(&geometry),
        };
        let windows = fs::windows(&geometry, window_bytes, space.total_bytes);
        let dir = File::open(&mount.mount_point)
            .map_err(|e| format!("cannot open {}: {e}", mount.mount_point.display()))?;
        let xfs_accounting = mount.fstype == "xfs"
            && geometry.origin == "xfs superblock"
            && fs::xfs_ag_free_bytes(&dir, 0, geometry.block_size).is_ok();
        Ok(Self {
            xfs_accounting,
            path: path.to_path_buf(),
            mount,
            geometry,
            window_bytes,
            windows,
            min_extent,
            discard,
            dir,
        })
    }

    /// Free bytes now (statvfs).
    pub fn free_bytes(&self) -> Result<u64, String> {
        Ok(fs::statvfs(&self.mount.mount_point)?.free_bytes)
    }
}

/// The outcome of one pass.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PassReport {
    pub mount: String,
    pub fstype: String,
    pub device: String,
    /// Where the window geometry comes from (superblock or default).
    pub geometry: String,
    pub group_bytes: u64,
    pub window_bytes: u64,
    pub windows_total: usize,
    pub windows_done: usize,
    pub min_extent: u64,
    /// How `bytes_trimmed` is known: "fitrim" (the file system's own count, ext4) or "xfs
    /// allocation group free space" (an upper bound; XFS's FITRIM reports the range scanned).
    pub accounting: String,
    /// Bytes the file system passed down for discard (FITRIM's answer: an upper bound of what
    /// the device freed).
    pub bytes_trimmed: u64,
    pub elapsed_seconds: f64,
    pub achieved_bytes_per_second: f64,
    /// Time spent waiting for the rate limiter.
    pub throttled_seconds: f64,
    pub limit: RateSpec,
    /// False when a stop signal ended the pass early.
    pub completed: bool,
}

impl PassReport {
    pub fn text(&self) -> String {
        let limit = self.limit.limit_text();
        let burst = if self.limit.burst > 0 {
            format!(
                ", burst {} at {}",
                human_bytes(self.limit.burst),
                self.limit
                    .burst_rate
                    .map(|r| human_rate(r as f64))
                    .unwrap_or_else(|| "no limit".into())
            )
        } else {
            String::new()
        };
        let stopped = if self.completed {
            String::new()
        } else {
            format!(
                " STOPPED after {} of {} windows",
                self.windows_done, self.windows_total
            )
        };
        format!(
            "{}: {} passed to discard in {:.2} s ({}; {limit}{burst}), {} windows of {} \
             ({}), min extent {}{stopped}",
            self.mount,
            human_bytes(self.bytes_trimmed),
            self.elapsed_seconds,
            human_rate(self.achieved_bytes_per_second),
            self.windows_total,
            human_bytes(self.window_bytes),
            self.geometry,
            human_bytes(self.min_extent),
        )
    }
}

/// Progress after each window.
pub struct Progress<'a> {
    pub mount: &'a str,
    pub windows_done: usize,
    pub windows_total: usize,
    pub bytes_trimmed: u64,
    pub elapsed: Duration,
}

fn xfs_window_free(t: &Target, w: Window) -> Option<u64> {
    let group = t.geometry.group_bytes.max(1);
    let end = w
        .start
        .saturating_add(w.len)
        .min(t.geometry.fs_bytes.unwrap_or(u64::MAX));
    if end <= w.start {
        return Some(0);
    }
    let first = w.start / group;
    let last = (end - 1) / group;
    let mut free = 0u64;
    for ag in first..=last {
        let ag = u32::try_from(ag).ok()?;
        free += fs::xfs_ag_free_bytes(&t.dir, ag, t.geometry.block_size).ok()?;
    }
    Some(free)
}

/// What an errno from FITRIM means for the user.
pub fn explain(errno: i32, t: &Target, window: Window) -> String {
    let mp = t.mount.mount_point.display();
    match errno {
        libc::EPERM | libc::EACCES => format!(
            "insufficient privileges: FITRIM on {mp} needs CAP_SYS_ADMIN (run sliver reclaim as root)"
        ),
        libc::EOPNOTSUPP | libc::ENOTTY | libc::ENOSYS => match t.discard {
            Some(_) => format!(
                "the {} file system at {mp} does not support FITRIM, or its device {} refuses discard",
                t.mount.fstype, t.mount.source
            ),
            None => format!(
                "the {} file system at {mp} does not support FITRIM",
                t.mount.fstype
            ),
        },
        libc::EROFS => format!("{mp} is read-only: nothing can be discarded"),
        libc::EINVAL => format!(
            "FITRIM rejected bytes {}..{} with minimum extent {} (is --min-extent larger than an \
             allocation group of {}?)",
            window.start,
            window.start.saturating_add(window.len),
            t.min_extent,
            human_bytes(t.geometry.group_bytes)
        ),
        _ => format!(
            "FITRIM on {mp} failed: {}",
            std::io::Error::from_raw_os_error(errno)
        ),
    }
}

/// Runs one pass: every window in order, each followed by the limiter's sleep. Stops between
/// windows when `stop` is set (the report says so). Any FITRIM error ends the pass with an
/// error that tells how far it got.
pub fn pass<C: Clock>(
    t: &Target,
    limiter: &mut Limiter<C>,
    stop: &AtomicBool,
    mut progress: Option<&mut dyn FnMut(&Progress)>,
) -> Result<PassReport, String> {
    let start = limiter.clock().now();
    let mount = t.mount.mount_point.display().to_string();
    let mut trimmed = 0u64;
    let mut throttled = Duration::ZERO;
    let mut done = 0;
    for w in &t.windows {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        // XFS: bound the answer by the free space of the groups the window covers, read
        // before the call (see fs::xfs_ag_free_bytes).
        let bound = if t.xfs_accounting {
            xfs_window_free(t, *w)
        } else {
            None
        };
        limiter.begin();
        let scanned = fs::fitrim(&t.dir, *w, t.min_extent).map_err(|e| {
            let why = explain(e.raw_os_error().unwrap_or(0), t, *w);
            if done == 0 {
                why
            } else {
                format!(
                    "{why}; the pass over {mount} stopped after {done} of {} windows \
                     ({} passed to discard)",
                    t.windows.len(),
                    human_bytes(trimmed)
                )
            }
        })?;
        let n = bound.map_or(scanned, |b| b.min(scanned));
        trimmed = trimmed.saturating_add(n);
        throttled += limiter.consume(n);
        done += 1;
        if let Some(p) = progress.as_mut() {
            p(&Progress {
                mount: &mount,
                windows_done: done,
                windows_total: t.windows.len(),
                bytes_trimmed: trimmed,
                elapsed: limiter.clock().now().saturating_sub(start),
            });
        }
    }
    let elapsed = limiter.clock().now().saturating_sub(start).as_secs_f64();
    Ok(PassReport {
        mount,
        fstype: t.mount.fstype.clone(),
        device: t.mount.source.clone(),
        geometry: t.geometry.origin.to_owned(),
        group_bytes: t.geometry.group_bytes,
        window_bytes: t.window_bytes,
        windows_total: t.windows.len(),
        windows_done: done,
        min_extent: t.min_extent,
        accounting: if t.xfs_accounting {
            "xfs allocation group free space"
        } else {
            "fitrim"
        }
        .to_owned(),
        bytes_trimmed: trimmed,
        elapsed_seconds: elapsed,
        achieved_bytes_per_second: if elapsed > 0.0 {
            trimmed as f64 / elapsed
        } else if trimmed == 0 {
            0.0
        } else {
            f64::INFINITY
        },
        throttled_seconds: throttled.as_secs_f64(),
        limit: limiter.spec(),
        completed: done == t.windows.len(),
    })
}

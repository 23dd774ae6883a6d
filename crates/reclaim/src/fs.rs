//! Mounted file systems: finding the mount, its device's discard limits, its allocation-group
//! geometry, the FITRIM windows and the FITRIM ioctl itself.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

/// Default window when the geometry cannot be read: an ext4 block group of 4 KiB blocks.
pub const DEFAULT_GROUP_BYTES: u64 = 128 << 20;
/// Largest default window: XFS allocation groups can be up to 1 TiB, and one FITRIM call over
/// that much free space is exactly the latency spike this tool exists to avoid.
pub const MAX_DEFAULT_WINDOW: u64 = 1 << 30;

/// One line of /proc/self/mountinfo that matters here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    pub mount_point: PathBuf,
    pub major: u32,
    pub minor: u32,
    pub fstype: String,
    pub source: String,
    pub read_only: bool,
}

fn unescape(s: &str) -> String {
    // mountinfo escapes space, tab, newline and backslash as \ooo.
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                let v = oct
                    .iter()
                    .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses the text of /proc/self/mountinfo; malformed lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if dash < 6 || fields.len() < dash + 3 {
            continue;
        }
        let Some((major, minor)) = fields[2].split_once(':') else {
            continue;
        };
        let (Ok(major), Ok(minor)) = (major.parse(), minor.parse()) else {
            continue;
        };
        let read_only = fields[5].split(',').any(|o| o == "ro");
        out.push(MountEntry {
            mount_point: PathBuf::from(unescape(fields[4])),
            major,
            minor,
            fstype: fields[dash + 1].to_owned(),
            source: unescape(fields[dash + 2]),
            read_only,
        });
    }
    out
}

/// Finds the file system mounted exactly at `path`.
pub fn find_mount(path: &Path) -> Result<MountEntry, String> {
    let canon = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    resolve_mount(&parse_mountinfo(&text), path, &canon)
}

/// The mount at `canon` (the last one mounted there wins), or a clear error naming the mount
/// that contains it.
pub fn resolve_mount(
    entries: &[MountEntry],
    given: &Path,
    canon: &Path,
) -> Result<MountEntry, String> {
    if let Some(m) = entries.iter().rev().find(|m| m.mount_point == canon) {
        return Ok(m.clone());
    }
    let containing = entries
        .iter()
        .filter(|m| canon.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.as_os_str().len());
    Err(match containing {
        Some(m) => format!(
            "{} is not a mount point (it lies in the {} file system mounted at {}); give the mount point",
            given.display(),
            m.fstype,
            m.mount_point.display()
        ),
        None => format!("{} is not a mount point", given.display()),
    })
}

/// Discard limits of the block device under a mount, from sysfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscardLimits {
    pub granularity: u64,
    pub max_bytes: u64,
}

/// Reads `queue/discard_*` of device `major:minor` (partitions use their disk's queue).
/// `None` when there is no block device (major 0: btrfs multi-device, tmpfs, NFS...).
pub fn discard_limits(major: u32, minor: u32) -> Option<DiscardLimits> {
    discard_limits_in(Path::new("/sys/dev/block"), major, minor)
}

pub fn discard_limits_in(sys_dev_block: &Path, major: u32, minor: u32) -> Option<DiscardLimits> {
    if major == 0 {
        return None;
    }
    let dev = sys_dev_block.join(format!("{major}:{minor}"));
    let queue = if dev.join("partition").exists() {
        dev.join("..").join("queue")
    } else {
        dev.join("queue")
    };
    let read = |name: &str| -> Option<u64> {
        std::fs::read_to_string(queue.join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some(DiscardLimits {
        granularity: read("discard_granularity")?,
        max_bytes: read("discard_max_bytes")?,
    })
}

/// Where the allocation groups of a file system lie, in bytes of its FITRIM address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Size of the FITRIM address space; `None` when unknown (the last window is open-ended).
    pub fs_bytes: Option<u64>,
    /// Size of one allocation group (ext4 block group, XFS AG).
    pub group_bytes: u64,
    /// Where group 0 starts (ext4 with 1 KiB blocks starts at block 1).
    pub first_group: u64,
    pub block_size: u64,
    /// Where the numbers come from: "ext4 superblock", "xfs superblock" or "default".
    pub origin: &'static str,
}

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// Parses an ext2/3/4 superblock (the 1024 bytes at offset 1024 of the device).
pub fn parse_ext4_superblock(sb: &[u8]) -> Option<Geometry> {
    if sb.len() < 0x160 || u16::from_le_bytes([sb[0x38], sb[0x39]]) != 0xef53 {
        return None;
    }
    let log = le32(sb, 0x18);
    if log > 6 {
        return None;
    }
    let bs = 1024u64 << log;
    let incompat = le32(sb, 0x60);
    let mut blocks = u64::from(le32(sb, 0x04));
    if incompat & 0x80 != 0 {
        blocks |= u64::from(le32(sb, 0x150)) << 32;
    }
    let per_group = u64::from(le32(sb, 0x20));
    let first = u64::from(le32(sb, 0x14));
    if per_group == 0 || blocks == 0 {
        return None;
    }
    Some(Geometry {
        fs_bytes: blocks.checked_mul(bs),
        group_bytes: per_group * bs,
        first_group: first * bs,
        block_size: bs,
        origin: "ext4 superblock",
    })
}

/// Parses an XFS superblock (the first sector of the device).
pub fn parse_xfs_superblock(sb: &[u8]) -> Option<Geometry> {
    if sb.len() < 0x5c || &sb[0..4] != b"XFSB" {
        return None;
    }
    let bs = u64::from(be32(sb, 4));
    let mut d = [0u8; 8];
    d.copy_from_slice(&sb[8..16]);
    let dblocks = u64::from_be_bytes(d);
    let agblocks = u64::from(be32(sb, 0x54));
    if !(512..=65536).contains(&bs) || agblocks == 0 || dblocks == 0 {
        return None;
    }
    Some(Geometry {
        fs_bytes: dblocks.checked_mul(bs),
        group_bytes: agblocks * bs,
        first_group: 0,
        block_size: bs,
        origin: "xfs superblock",
    })
}

/// Reads the geometry from the mounted device's superblock; falls back to 128 MiB groups and
/// the size statfs reports when the device cannot be read or the type is not ext*/xfs.
pub fn geometry(mount: &MountEntry, statfs_bytes: u64, block_size: u64) -> Geometry {
    let fallback = Geometry {
        fs_bytes: None,
        group_bytes: DEFAULT_GROUP_BYTES.max(block_size),
        first_group: 0,
        block_size: block_size.max(512),
        origin: "default",
    };
    let _ = statfs_bytes;
    let mut buf = vec![0u8; 2048];
    let read = File::open(&mount.source).and_then(|mut f| f.read_exact(&mut buf));
    if read.is_err() {
        return fallback;
    }
    let parsed = match mount.fstype.as_str() {
        "ext2" | "ext3" | "ext4" => parse_ext4_superblock(&buf[1024..]),
        "xfs" => parse_xfs_superblock(&buf[..512]),
        _ => None,
    };
    parsed.unwrap_or(fallback)
}

/// A FITRIM window: bytes `start .. start+len` of the file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: u64,
    pub len: u64,
}

/// The default window size for a geometry: one allocation group, split when larger than 1 GiB.
pub fn default_window(g: &Geometry) -> u64 {
    if g.group_bytes <= MAX_DEFAULT_WINDOW {
        g.group_bytes
    } else {
        g.group_bytes
            .div_ceil(g.group_bytes.div_ceil(MAX_DEFAULT_WINDOW))
    }
}

/// Windows over the whole file system. Group boundaries are always window boundaries: a window
/// of several groups covers whole groups; a window smaller than a group splits it in equal
/// parts (rounded to the block size). With an unknown size, windows run up to `estimate` and
/// the last one is open-ended.
pub fn windows(g: &Geometry, window: u64, estimate: u64) -> Vec<Window> {
    let group = g.group_bytes.max(1);
    let bs = g.block_size.max(1);
    let end = g.fs_bytes.unwrap_or(estimate.max(1));
    let mut out = Vec::new();
    let (step_groups, parts) = if window >= group {
        (window / group, 1)
    } else {
        (1, group.div_ceil(window.max(bs)))
    };
    let piece = group.div_ceil(parts).div_ceil(bs) * bs;
    let mut cuts = vec![0u64];
    let mut gs = g.first_group;
    let mut j = 0u64;
    while gs < end {
        if j > 0 && j.is_multiple_of(step_groups) {
            cuts.push(gs);
        }
        for i in 1..parts {
            let c = gs + i * piece;
            if c < (gs + group).min(end) {
                cuts.push(c);
            }
        }
        gs += group;
        j += 1;
    }
    cuts.dedup();
    for (i, &start) in cuts.iter().enumerate() {
        let stop = cuts.get(i + 1).copied().unwrap_or(end);
        if stop <= start {
            continue;
        }
        let len = if i + 1 == cuts.len() && g.fs_bytes.is_none() {
            u64::MAX - start
        } else {
            stop - start
        };
        out.push(Window { start, len });
    }
    out
}

/// `struct fstrim_range` of linux/fs.h.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
struct FstrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}

/// `_IOWR('X', 121, struct fstrim_range)`.
const FITRIM: u64 = 0xc018_5879;

/// Runs FITRIM on the directory `dir` (any fd of the file system) over one window. Returns the
/// bytes the file system passed down for discard.
pub fn fitrim(dir: &File, window: Window, minlen: u64) -> std::io::Result<u64> {
    let mut range = FstrimRange {
        start: window.start,
        len: window.len,
        minlen,
    };
    // SAFETY: FITRIM reads and writes one fstrim_range, which outlives the call.
    let r = unsafe { libc::ioctl(dir.as_raw_fd(), FITRIM as _, &mut range as *mut FstrimRange) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(range.len)
}

/// `struct xfs_ag_geometry` of xfs_fs.h.
#[repr(C)]
#[derive(Default)]
struct XfsAgGeometry {
    ag_number: u32,
    ag_length: u32,
    ag_freeblks: u32,
    ag_icount: u32,
    ag_ifree: u32,
    ag_sick: u32,
    ag_checked: u32,
    ag_flags: u32,
    ag_reserved: [u64; 12],
}

/// `_IOWR('X', 61, struct xfs_ag_geometry)`.
const XFS_IOC_AG_GEOMETRY: u64 = 0xc080_583d;

/// Free bytes of XFS allocation group `ag` (Linux 5.2+).
///
/// XFS's FITRIM answers with the length of the range it scanned rather than the bytes it
/// discarded, so the free space of the groups a window covers is the best bound of what it
/// passed down.
pub fn xfs_ag_free_bytes(dir: &File, ag: u32, block_size: u64) -> std::io::Result<u64> {
    let mut g = XfsAgGeometry {
        ag_number: ag,
        ..XfsAgGeometry::default()
    };
    // SAFETY: the ioctl reads and writes one xfs_ag_geometry, which outlives the call.
    let r = unsafe {
        libc::ioctl(
            dir.as_raw_fd(),
            XFS_IOC_AG_GEOMETRY as _,
            &mut g as *mut XfsAgGeometry,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(u64::from(g.ag_freeblks) * block_size)
}

/// Space figures of a mounted file system, from statvfs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub block_size: u64,
}

pub fn statvfs(path: &Path) -> Result<FsSpace, String> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| format!("{}: path contains a NUL byte", path.display()))?;
    // SAFETY: statvfs fills the zeroed struct we own; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if r != 0 {
        return Err(format!(
            "statvfs {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ));
    }
    let frsize = if st.f_frsize > 0 {
        st.f_frsize as u64
    } else {
        st.f_bsize as u64
    };
    Ok(FsSpace {
        total_bytes: (st.f_blocks as u64).saturating_mul(frsize),
        free_bytes: (st.f_bfree as u64).saturating_mul(frsize),
        block_size: frsize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 7:3 / /tmp/x\\040y rw,relatime shared:20 - xfs /dev/loop3 rw,attr2
41 22 0:45 / /run/t rw,nosuid master:3 - tmpfs tmpfs rw,size=10k
42 41 7:4 / /run/t ro,relatime - ext4 /dev/loop4 ro
garbage line
";

    #[test]
    fn mountinfo_and_resolution() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 4);
        assert_eq!(m[1].mount_point, PathBuf::from("/tmp/x y"));
        assert_eq!((m[1].major, m[1].minor), (7, 3));
        assert_eq!(m[1].fstype, "xfs");
        assert_eq!(m[1].source, "/dev/loop3");
        // The last mount on a path hides the earlier ones.
        let r = resolve_mount(&m, Path::new("/run/t"), Path::new("/run/t")).unwrap();
        assert_eq!((r.fstype.as_str(), r.read_only), ("ext4", true));
        let e =
            resolve_mount(&m, Path::new("/tmp/x y/sub"), Path::new("/tmp/x y/sub")).unwrap_err();
        assert!(
            e.contains("not a mount point") && e.contains("/tmp/x y"),
            "{e}"
        );
        let e = resolve_mount(&m, Path::new("/home"), Path::new("/home")).unwrap_err();
        assert!(e.contains("mounted at /"), "{e}");
    }

    #[test]
    fn sysfs_discard_limits_and_partitions() {
        let d = tempfile::tempdir().unwrap();
        let disk = d.path().join("devices/vdb");
        std::fs::create_dir_all(disk.join("queue")).unwrap();
        std::fs::create_dir_all(disk.join("vdb1")).unwrap();
        std::fs::write(disk.join("queue/discard_granularity"), "65536\n").unwrap();
        std::fs::write(disk.join("queue/discard_max_bytes"), "0\n").unwrap();
        std::fs::write(disk.join("vdb1/partition"), "1\n").unwrap();
        let sdb = d.path().join("dev/block");
        std::fs::create_dir_all(&sdb).unwrap();
        std::os::unix::fs::symlink(&disk, sdb.join("252:16")).unwrap();
        std::os::unix::fs::symlink(disk.join("vdb1"), sdb.join("252:17")).unwrap();
        let want = Some(DiscardLimits {
            granularity: 65536,
            max_bytes: 0,
        });
        assert_eq!(discard_limits_in(&sdb, 252, 16), want);
        assert_eq!(discard_limits_in(&sdb, 252, 17), want);
        assert_eq!(discard_limits_in(&sdb, 252, 99), None);
        assert_eq!(discard_limits_in(&sdb, 0, 45), None);
    }

    fn ext4_sb(blocks: u64, log: u32, per_group: u32, first: u32, bit64: bool) -> Vec<u8> {
        let mut sb = vec![0u8; 1024];
        sb[0x04..0x08].copy_from_slice(&(blocks as u32).to_le_bytes());
        sb[0x14..0x18].copy_from_slice(&first.to_le_bytes());
        sb[0x18..0x1c].copy_from_slice(&log.to_le_bytes());
        sb[0x20..0x24].copy_from_slice(&per_group.to_le_bytes());
        sb[0x38..0x3a].copy_from_slice(&0xef53u16.to_le_bytes());
        if bit64 {
            sb[0x60..0x64].copy_from_slice(&0x80u32.to_le_bytes());
            sb[0x150..0x154].copy_from_slice(&((blocks >> 32) as u32).to_le_bytes());
        }
        sb
    }

    #[test]
    fn superblocks() {
        let g = parse_ext4_superblock(&ext4_sb(131072, 2, 32768, 0, false)).unwrap();
        assert_eq!(g.fs_bytes, Some(512 << 20));
        assert_eq!(g.group_bytes, 128 << 20);
        assert_eq!(g.first_group, 0);
        let g = parse_ext4_superblock(&ext4_sb(1 << 33, 2, 32768, 0, true)).unwrap();
        assert_eq!(g.fs_bytes, Some(32 << 40));
        let g = parse_ext4_superblock(&ext4_sb(65536, 0, 8192, 1, false)).unwrap();
        assert_eq!(
            (g.block_size, g.group_bytes, g.first_group),
            (1024, 8 << 20, 1024)
        );
        let mut bad = ext4_sb(1, 2, 0, 0, false);
        assert_eq!(parse_ext4_superblock(&bad), None);
        bad[0x38] = 0;
        assert_eq!(parse_ext4_superblock(&bad), None);

        let mut x = vec![0u8; 512];
        x[0..4].copy_from_slice(b"XFSB");
        x[4..8].copy_from_slice(&4096u32.to_be_bytes());
        x[8..16].copy_from_slice(&131072u64.to_be_bytes());
        x[0x54..0x58].copy_from_slice(&32768u32.to_be_bytes());
        let g = parse_xfs_superblock(&x).unwrap();
        assert_eq!((g.fs_bytes, g.group_bytes), (Some(512 << 20), 128 << 20));
        assert_eq!(parse_xfs_superblock(&x[..64]), None);
    }

    fn geo(fs: Option<u64>, group: u64, first: u64) -> Geometry {
        Geometry {
            fs_bytes: fs,
            group_bytes: group,
            first_group: first,
            block_size: 1024,
            origin: "test",
        }
    }

    fn covers(ws: &[Window], end: u64) {
        let mut at = 0;
        for w in ws {
            assert_eq!(w.start, at, "windows are contiguous: {ws:?}");
            assert!(w.len > 0);
            at = w.start.saturating_add(w.len);
        }
        assert!(at >= end, "windows cover the file system: {ws:?}");
    }

    #[test]
    fn windows_follow_groups() {
        const M: u64 = 1 << 20;
        // 4.5 groups of 128 MiB: one window per group, the last one partial.
        let g = geo(Some(576 * M), 128 * M, 0);
        let w = windows(&g, 128 * M, 0);
        assert_eq!(w.len(), 5);
        assert_eq!(
            w[4],
            Window {
                start: 512 * M,
                len: 64 * M
            }
        );
        covers(&w, 576 * M);
        // Two groups per window.
        let w = windows(&g, 256 * M, 0);
        assert_eq!(
            w.iter().map(|w| w.start / M).collect::<Vec<_>>(),
            [0, 256, 512]
        );
        covers(&w, 576 * M);
        // Quarter groups: every group boundary is still a boundary.
        let w = windows(&g, 32 * M, 0);
        assert_eq!(w.len(), 18);
        for b in [128 * M, 256 * M, 384 * M, 512 * M] {
            assert!(w.iter().any(|w| w.start == b), "{b}");
        }
        covers(&w, 576 * M);
        // 1 KiB-block ext4: groups start at byte 1024.
        let g = geo(Some(64 * M), 8 * M, 1024);
        let w = windows(&g, 8 * M, 0);
        assert_eq!(
            w[0],
            Window {
                start: 0,
                len: 8 * M + 1024
            }
        );
        assert_eq!(w[1].start, 8 * M + 1024);
        covers(&w, 64 * M);
        // Unknown size: the last window is open-ended.
        let g = geo(None, 128 * M, 0);
        let w = windows(&g, 128 * M, 300 * M);
        assert_eq!(w.len(), 3);
        assert_eq!(w[2].start.checked_add(w[2].len), Some(u64::MAX));
        // Huge AGs are split by default.
        let g = geo(Some(8 << 40), 1 << 40, 0);
        assert_eq!(default_window(&g), 1 << 30);
    }
}

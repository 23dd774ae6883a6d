//! The root: the one small file that names a consistent set of metadata pages at one log
//! position, replaced atomically by each checkpoint (`engine/root`). Layout (little-endian):
//!
//! ```text
//! "SLVRROOT" u64 | version u32 (4) | crc32c u32 (of the body) | body length u32 | body
//! body:
//!   geometry   chunk size u32 | segment size u32 | segment count u32 | hash key [32]
//!   position   segment u32 | sequence u64 | offset u32       replay starts here
//!   counters   host bytes u64 | collector bytes u64 | next volume u32 | generation u64
//!              anchored u64 | live bytes u64
//!   hooks      level u8 | split u64 | entries u64
//!   tables     n u8, then n x ( table u8 | pages u64 | entries u64 | m u32 |
//!                               m x ( slot u64 | crc u32 | gen u64 ) )
//!                                   the table's top directory pages (each names 204
//!                                   directory pages, each naming 204 of the table's pages)
//! ```
//!
//! Version 3 (before the delta journal) is read too: its places have no generation
//! (`slot u64 | crc u32`, in the root and in directory pages), it has no journal table, and
//! the root names the directory pages themselves (341 places a page), not top pages.
//!
//! ```text
//!   volumes    n u32, then n x ( id u32 | size u64 | root node u64 | height u8 )
//!   releasing  n u32, then n x node u64
//! ```

use super::hooks::HookShape;
use super::layout::{dir_per_page, loc_bytes};
pub use super::layout::{TableRoot, ROOT_VERSION, ROOT_VERSION_V3};
use super::map_tree::Volume;
use super::page_store::{PageLoc, PAGE_LOC_BYTES};
use crate::le::{LeReader, LeWriter, Short};

pub const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"SLVRROOT");
/// Fixed parameters of an engine, chosen at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub chunk_size: u32,
    pub segment_size: u32,
    pub segment_count: u32,
    /// Key of the keyed BLAKE3 fingerprint: crafted collisions need it.
    pub key: [u8; 32],
}

/// A position in the log: where the head is, and where replay starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    pub segment: u32,
    pub seq: u64,
    pub offset: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes of chunk records written for hosts.
    pub host_bytes: u64,
    /// Bytes of chunk records rewritten by the garbage collector.
    pub gc_bytes: u64,
    pub next_volume: u32,
}

// Every root version and format 2's checkpoint begin with the geometry in this layout: it
// never changes.
impl Geometry {
    pub(crate) fn read(r: &mut LeReader) -> Result<Self, Short> {
        Ok(Geometry {
            chunk_size: r.u32()?,
            segment_size: r.u32()?,
            segment_count: r.u32()?,
            key: r.take(32)?.try_into().unwrap(),
        })
    }
    pub(crate) fn write(&self, w: &mut LeWriter) {
        w.u32(self.chunk_size);
        w.u32(self.segment_size);
        w.u32(self.segment_count);
        w.bytes(&self.key);
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// The format the root was read in ([`ROOT_VERSION`] for every root written).
    pub version: u32,
    pub geometry: Geometry,
    pub head: Head,
    pub counters: Counters,
    /// Checkpoints written since the array was created.
    pub generation: u64,
    pub anchored: u64,
    pub live_bytes: u64,
    pub hooks: HookShape,
    pub tables: Vec<TableRoot>,
    pub volumes: Vec<(u32, Volume)>,
    pub releasing: Vec<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RootError {
    #[error("not a sliver root file")]
    Magic,
    #[error("root format version {0} is not supported by this version of sliver")]
    Version(u32),
    #[error("root checksum mismatch (the file is damaged)")]
    Checksum,
    #[error("root is damaged: {0}")]
    Malformed(&'static str),
}

impl From<Short> for RootError {
    fn from(short: Short) -> Self {
        RootError::Malformed(short.what())
    }
}

impl Root {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = LeWriter(Vec::with_capacity(256));
        self.geometry.write(&mut w);
        w.u32(self.head.segment);
        w.u64(self.head.seq);
        w.u32(self.head.offset);
        w.u64(self.counters.host_bytes);
        w.u64(self.counters.gc_bytes);
        w.u32(self.counters.next_volume);
        w.u64(self.generation);
        w.u64(self.anchored);
        w.u64(self.live_bytes);
        w.u8(self.hooks.level);
        w.u64(self.hooks.split);
        w.u64(self.hooks.entries);
        w.u8(self.tables.len() as u8);
        for t in &self.tables {
            w.u8(t.table);
            w.u64(t.pages);
            w.u64(t.entries);
            w.u32(t.dir.len() as u32);
            for loc in &t.dir {
                let mut b = [0u8; PAGE_LOC_BYTES];
                loc.encode(&mut b);
                w.0.extend_from_slice(&b);
            }
        }
        w.u32(self.volumes.len() as u32);
        for (id, v) in &self.volumes {
            w.u32(*id);
            w.u64(v.size);
            w.u64(v.root);
            w.u8(v.height);
        }
        w.u32(self.releasing.len() as u32);
        for n in &self.releasing {
            w.u64(*n);
        }
        let body = w.0;
        let mut out = Vec::with_capacity(body.len() + 20);
        out.extend_from_slice(&ROOT_MAGIC.to_le_bytes());
        out.extend_from_slice(&ROOT_VERSION.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Root, RootError> {
        let mut r = LeReader(bytes);
        if r.u64().map_err(|_| RootError::Magic)? != ROOT_MAGIC {
            return Err(RootError::Magic);
        }
        let version = r.u32()?;
        if version != ROOT_VERSION && version != ROOT_VERSION_V3 {
            return Err(RootError::Version(version));
        }
        let loc = loc_bytes(version);
        let crc = r.u32()?;
        let len = r.u32()? as usize;
        let body = r.take(len)?;
        if !r.0.is_empty() {
            return Err(RootError::Malformed("bytes after the body"));
        }
        if crc32c::crc32c(body) != crc {
            return Err(RootError::Checksum);
        }
        let mut r = LeReader(body);
        let geometry = Geometry::read(&mut r)?;
        if !geometry.chunk_size.is_power_of_two()
            || geometry.chunk_size < 512
            || geometry.segment_size < geometry.chunk_size
            || geometry.segment_count == 0
        {
            return Err(RootError::Malformed("impossible geometry"));
        }
        let head = Head {
            segment: r.u32()?,
            seq: r.u64()?,
            offset: r.u32()?,
        };
        if head.segment >= geometry.segment_count || head.offset > geometry.segment_size {
            return Err(RootError::Malformed("position outside the log"));
        }
        let counters = Counters {
            host_bytes: r.u64()?,
            gc_bytes: r.u64()?,
            next_volume: r.u32()?,
        };
        let generation = r.u64()?;
        let anchored = r.u64()?;
        let live_bytes = r.u64()?;
        let hooks = HookShape {
            level: r.u8()?,
            split: r.u64()?,
            entries: r.u64()?,
        };
        if hooks.level > 48 || hooks.split >= 1u64 << hooks.level {
            return Err(RootError::Malformed("impossible hook table shape"));
        }
        let n = r.u8()? as usize;
        let mut tables = Vec::with_capacity(n);
        for _ in 0..n {
            let table = r.u8()?;
            let pages = r.u64()?;
            let entries = r.u64()?;
            let m = r.count(loc)?;
            let dir: Vec<PageLoc> = (0..m)
                .map(|_| r.take(loc).map(PageLoc::decode))
                .collect::<Result<_, _>>()?;
            let per = dir_per_page(version);
            let named = if version == ROOT_VERSION_V3 {
                pages.div_ceil(per)
            } else {
                pages.div_ceil(per).div_ceil(per)
            };
            if named != m as u64 {
                return Err(RootError::Malformed(
                    "directory pages do not match the table's size",
                ));
            }
            if tables.iter().any(|t: &TableRoot| t.table == table) {
                return Err(RootError::Malformed("a table named twice"));
            }
            tables.push(TableRoot {
                table,
                pages,
                entries,
                dir,
            });
        }
        let n = r.count(21)?;
        let mut volumes = Vec::with_capacity(n);
        for _ in 0..n {
            let id = r.u32()?;
            let v = Volume {
                size: r.u64()?,
                root: r.u64()?,
                height: r.u8()?,
            };
            if id == 0 || v.height > 6 || volumes.iter().any(|(i, _)| *i == id) {
                return Err(RootError::Malformed("impossible volume"));
            }
            volumes.push((id, v));
        }
        let n = r.count(8)?;
        let releasing = (0..n).map(|_| r.u64()).collect::<Result<_, _>>()?;
        if !r.0.is_empty() {
            return Err(RootError::Malformed("trailing bytes in the body"));
        }
        Ok(Root {
            version,
            geometry,
            head,
            counters,
            generation,
            anchored,
            live_bytes,
            hooks,
            tables,
            volumes,
            releasing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::page_store::PAGE_LOC_BYTES_V3;

    pub fn sample() -> Root {
        Root {
            version: ROOT_VERSION,
            geometry: Geometry {
                chunk_size: 4096,
                segment_size: 4 << 20,
                segment_count: 100,
                key: [7; 32],
            },
            head: Head {
                segment: 3,
                seq: 99,
                offset: 4096,
            },
            counters: Counters {
                host_bytes: 1,
                gc_bytes: 2,
                next_volume: 5,
            },
            generation: 8,
            anchored: 3,
            live_bytes: 1 << 30,
            hooks: HookShape {
                level: 5,
                split: 3,
                entries: 1000,
            },
            tables: vec![TableRoot {
                table: 1,
                // Two top directory pages: more than 204 x 204 pages.
                pages: 50_000,
                entries: 0,
                dir: vec![
                    PageLoc {
                        slot: 4,
                        crc: 9,
                        gen: 3,
                    },
                    PageLoc {
                        slot: 1 << 40,
                        crc: 1,
                        gen: 1 << 33,
                    },
                ],
            }],
            volumes: vec![(
                1,
                Volume {
                    size: 1 << 40,
                    root: 12,
                    height: 3,
                },
            )],
            releasing: vec![5, 6],
        }
    }

    #[test]
    fn a_root_round_trips_and_damage_is_refused() {
        let root = sample();
        let bytes = root.encode();
        assert_eq!(Root::decode(&bytes).unwrap(), root);
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x10;
            assert!(Root::decode(&bad).is_err(), "flip at {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(Root::decode(&bytes[..n]).is_err());
        }
        let mut v5 = bytes.clone();
        v5[8..12].copy_from_slice(&5u32.to_le_bytes());
        assert_eq!(Root::decode(&v5), Err(RootError::Version(5)));
    }

    #[test]
    fn a_format_3_root_is_read_with_generation_0() {
        // A format 3 root: the same body with 12-byte places (no generation).
        let mut root = sample();
        root.tables[0].pages = 600; // two format 3 directory pages (341 places each)
        let v4 = root.encode();
        let body_at = 20;
        let mut body = v4[body_at..].to_vec();
        let dir_at = body.len() - 4 - 21 - 4 - 16 - 2 * PAGE_LOC_BYTES;
        let mut v3_dir = Vec::new();
        for loc in &root.tables[0].dir {
            let mut b = [0u8; PAGE_LOC_BYTES];
            loc.encode(&mut b);
            v3_dir.extend_from_slice(&b[..PAGE_LOC_BYTES_V3]);
        }
        body.splice(dir_at..dir_at + 2 * PAGE_LOC_BYTES, v3_dir);
        let mut v3 = Vec::new();
        v3.extend_from_slice(&ROOT_MAGIC.to_le_bytes());
        v3.extend_from_slice(&ROOT_VERSION_V3.to_le_bytes());
        v3.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        v3.extend_from_slice(&(body.len() as u32).to_le_bytes());
        v3.extend_from_slice(&body);
        let read = Root::decode(&v3).unwrap();
        assert_eq!(read.version, ROOT_VERSION_V3);
        assert_eq!(
            read.tables[0].dir,
            root.tables[0]
                .dir
                .iter()
                .map(|l| PageLoc { gen: 0, ..*l })
                .collect::<Vec<_>>()
        );
        // What is written is always the current version.
        assert_eq!(read.encode()[8..12], ROOT_VERSION.to_le_bytes());
    }
}

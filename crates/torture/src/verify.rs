//! Verification after a restart: read back every block the model knows, check it holds an
//! allowed version, and settle the model to what was read.

use crate::io::{naa_designator, Lun};
use crate::model::{self, Model, Vid, BLOCK, ZEROS};
use sliver_initiator::sense::status;
use sliver_initiator::{cdb, Session, SessionOptions};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Reads kept in flight while verifying.
const QUEUE_DEPTH: usize = 8;
/// Largest read.
const MAX_READ_BLOCKS: u64 = 256;
/// Untouched blocks a read may span to join two touched runs.
const MAX_GAP: u64 = 16;

#[derive(Debug, Default)]
pub struct Verified {
    /// Blocks checked.
    pub blocks: u64,
    pub failures: Vec<String>,
    /// MAXIMUM COMPARE AND WRITE LENGTH.
    pub max_caw: u64,
    /// Read-only LUNs holding unrecognisable data: dropped from the model.
    pub dropped: Vec<u64>,
    /// Blocks that may hold several versions (unflushed or in flight at the kill) ...
    pub uncertain: u64,
    /// ... of which read back as the newest version.
    pub uncertain_newest: u64,
}

/// Contiguous reads covering `lbas` (sorted).
fn runs(lbas: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &b in lbas {
        match out.last_mut() {
            Some((start, n)) if b < *start + *n + MAX_GAP && b + 1 - *start <= MAX_READ_BLOCKS => {
                *n = b + 1 - *start;
            }
            _ => out.push((b, 1)),
        }
    }
    out
}

fn login(url: &str) -> Result<Session, String> {
    let options = SessionOptions {
        timeout: Duration::from_secs(30),
        ..SessionOptions::default()
    };
    Session::connect(url, options).map_err(|e| format!("verification login failed: {e}"))
}

/// Verifies every LUN of `model` through `url` (any LUN of the target). `pairs` are (source,
/// copy) LUNs snapshotted or cloned since the last verification: they must read the same.
pub fn verify(
    url: &str,
    luns: &mut [Lun],
    model: &mut Model,
    pairs: &[(u64, u64)],
) -> Result<Verified, String> {
    let mut s = login(url)?;
    let mut out = Verified::default();
    for lun in luns.iter_mut() {
        let mut ready = false;
        for _ in 0..4 {
            let c = s
                .execute(cdb::test_unit_ready().on_lun(lun.lun))
                .map_err(|e| format!("TEST UNIT READY of LUN {}: {e}", lun.lun))?;
            if c.is_good() {
                ready = true;
                break;
            }
        }
        if !ready {
            out.failures
                .push(format!("LUN {} is not ready after the restart", lun.lun));
        }
        if lun.designator.is_none() {
            let c = s
                .execute(cdb::inquiry(Some(0x83), 255).on_lun(lun.lun))
                .map_err(|e| format!("INQUIRY VPD 83h of LUN {}: {e}", lun.lun))?;
            if c.is_good() {
                lun.designator = naa_designator(&c.data);
            }
        }
    }
    if let Some(first) = luns.first() {
        let c = s
            .execute(cdb::inquiry(Some(0xb0), 64).on_lun(first.lun))
            .map_err(|e| format!("INQUIRY VPD B0h: {e}"))?;
        if c.is_good() && c.data.len() > 5 {
            out.max_caw = u64::from(c.data[5]);
        }
    }
    let paired: HashSet<u64> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
    let mut seen: HashMap<(u64, u64), Option<Vid>> = HashMap::new();
    let mut settle: Vec<(u64, u64, Vid)> = Vec::new();
    let mut unknown: Vec<(u64, u64)> = Vec::new();
    for lun in model.luns() {
        let touched = model.touched(lun);
        let set: HashSet<u64> = touched.iter().copied().collect();
        let mut todo = runs(&touched).into_iter();
        let mut inflight: HashMap<u32, (u64, u64)> = HashMap::new();
        loop {
            while inflight.len() < QUEUE_DEPTH {
                let Some((lba, n)) = todo.next() else { break };
                let cmd = cdb::read16(lba, n as u32, BLOCK as u32)
                    .map_err(|e| e.to_string())?
                    .on_lun(lun);
                let tag = s
                    .submit(cmd)
                    .map_err(|e| format!("verification READ: {e}"))?;
                inflight.insert(tag.0, (lba, n));
            }
            if inflight.is_empty() {
                break;
            }
            let c = s
                .wait_any()
                .map_err(|e| format!("verification READ: {e}"))?;
            let Some((lba, n)) = inflight.remove(&c.tag.0) else {
                return Err(format!("completion for unknown tag {:#x}", c.tag.0));
            };
            if !c.is_good() || c.data.len() != (n as usize) * BLOCK {
                out.failures.push(format!(
                    "READ of LUN {lun} LBA {lba} x{n} failed: {} {} ({} bytes)",
                    status::name(c.status),
                    c.sense.map(|s| s.to_string()).unwrap_or_default(),
                    c.data.len()
                ));
                continue;
            }
            for (i, block) in c.data.chunks_exact(BLOCK).enumerate() {
                let b = lba + i as u64;
                if !set.contains(&b) {
                    continue;
                }
                out.blocks += 1;
                let allowed = model.allowed(lun, b);
                if allowed.len() > 1 {
                    out.uncertain += 1;
                }
                match model.check(lun, b, block) {
                    Ok(v) => {
                        if allowed.len() > 1 && allowed.last() == Some(&v) {
                            out.uncertain_newest += 1;
                        }
                        settle.push((lun, b, v))
                    }
                    Err(m) => {
                        out.failures.push(m.to_string());
                        match m.found {
                            Some(v) => settle.push((lun, b, v)),
                            None => unknown.push((lun, b)),
                        }
                    }
                }
                if paired.contains(&lun) {
                    seen.insert((lun, b), model::identify(block));
                }
            }
        }
    }
    for &(src, copy) in pairs {
        let mut differ = 0;
        for b in model.touched(copy) {
            let (a, c) = (seen.get(&(src, b)), seen.get(&(copy, b)));
            if a.is_some() && c.is_some() && a != c {
                differ += 1;
                if differ <= 5 {
                    out.failures.push(format!(
                        "LUN {copy} (snapshot/clone of LUN {src} taken after the crash) differs at LBA {b}: {} vs {}",
                        a.copied().flatten().map_or("garbage".into(), model::describe_vid),
                        c.copied().flatten().map_or("garbage".into(), model::describe_vid)
                    ));
                }
            }
        }
        if differ > 5 {
            out.failures
                .push(format!("LUN {copy}: {} more differing blocks", differ - 5));
        }
    }
    for (lun, b, v) in settle {
        model.settle(lun, b, v);
    }
    // Unrecognisable blocks: overwrite with zeros (durably) so the next cycles start from a
    // known state; a read-only LUN is dropped.
    for (lun, b) in unknown {
        let writable = luns.iter().any(|l| l.lun == lun && l.writable);
        if !writable {
            if !out.dropped.contains(&lun) {
                out.dropped.push(lun);
            }
            continue;
        }
        let cmd = cdb::write16(b, vec![0u8; BLOCK], BLOCK as u32, true)
            .map_err(|e| e.to_string())?
            .on_lun(lun);
        let c = s.execute(cmd).map_err(|e| format!("repair WRITE: {e}"))?;
        if c.is_good() {
            model.settle(lun, b, ZEROS);
        } else {
            out.failures
                .push(format!("repair WRITE of LUN {lun} LBA {b} failed"));
        }
    }
    for lun in &out.dropped {
        model.remove_lun(*lun);
    }
    let _ = s.logout();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn reads_cover_touched_blocks() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[5, 6, 7, 30, 100]), vec![(5, 3), (30, 1), (100, 1)]);
        assert_eq!(runs(&[5, 10, 20]), vec![(5, 16)]);
        let many: Vec<u64> = (0..600).collect();
        assert_eq!(runs(&many), vec![(0, 256), (256, 256), (512, 88)]);
    }
}

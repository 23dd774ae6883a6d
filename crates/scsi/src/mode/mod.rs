//! Mode parameters: MODE SENSE(6/10) and MODE SELECT(6/10) over four pages.
//!
//! - 0x01 read-write error recovery (fixed: automatic reallocation on, nothing changeable)
//! - 0x08 caching: WCE is real. The volume has a volatile cache (page cache), so WCE=1 by
//!   default and SYNCHRONIZE CACHE / FUA make data durable; with WCE=0 every write is
//!   made durable before completion.
//! - 0x0A control: D_SENSE (descriptor-format sense) and SWP (software write protect) are
//!   changeable. TST=000 (one task set shared by every nexus) and TAS=1 (a command aborted by
//!   another nexus's task management ends with TASK ABORTED status, `crate::tmf::unit`) are
//!   fixed.
//! - 0x1C informational exceptions (fixed: reporting disabled)
//! - 0x1C/0x02 logical block provisioning (SBC-3 6.5.8), for volumes in a pool: one soft
//!   threshold descriptor on used LBA mapping resources, in threshold sets of
//!   2^THRESHOLD EXPONENT blocks (VPD B2h). ENABLED and THRESHOLD COUNT are changeable; the
//!   threshold belongs to the pool, so a change applies to every volume of the array.
//!
//! Parameters are shared by all nexuses; the LU holds them (`params`). The caching page is
//! saveable (PS=1) when the LU has a place to keep it ([`SavedModePages`], the array's volume
//! record): MODE SELECT with SP=1 saves WCE there, MODE SENSE reports it as the saved value,
//! and the volume starts with it. The other pages are not saveable; their saved values are
//! their defaults (the threshold's is the pool's kept value).

mod params;

pub(crate) use params::ModeParams;
pub use params::SavedModePages;

use crate::outcome::invalid_cdb;
use std::sync::atomic::Ordering;

use crate::cdb::PageControl;
use crate::lu::LogicalUnit;
use crate::outcome::{data_out_prefix, truncated, Done, Failure, Outcome};
use crate::param::ParamList;
use crate::range_lock::lock_unpoisoned;
use crate::{Nexus, SenseReason};

const PAGE_ERROR_RECOVERY: u8 = 0x01;
const PAGE_CACHING: u8 = 0x08;
const PAGE_CONTROL: u8 = 0x0a;
const PAGE_INFO_EXCEPTIONS: u8 = 0x1c;
const SUBPAGE_LBP: u8 = 0x02;
const ALL_PAGES: u8 = 0x3f;
const ALL_SUBPAGES: u8 = 0xff;
/// (page, subpage) in the order MODE SENSE returns them.
const PAGES: [(u8, u8); 5] = [
    (PAGE_ERROR_RECOVERY, 0),
    (PAGE_CACHING, 0),
    (PAGE_CONTROL, 0),
    (PAGE_INFO_EXCEPTIONS, 0),
    (PAGE_INFO_EXCEPTIONS, SUBPAGE_LBP),
];
/// Default soft threshold: 80% of the pool in use.
const DEFAULT_THRESHOLD_SHARE: f64 = 0.8;
const THRESHOLD_ENABLED: u8 = 0x80;
/// THRESHOLD ARMING 001b: the threshold triggers as the resource count increases.
const ARMING_INCREASING: u8 = 0x01;
/// THRESHOLD RESOURCE 02h: used LBA mapping resources.
const RESOURCE_USED_LBA_MAPPING: u8 = 0x02;

const PS: u8 = 0x80; // page byte 0: parameters saveable
const WCE: u8 = 0x04; // caching page byte 2
const D_SENSE: u8 = 0x04; // control page byte 2
const SWP: u8 = 0x08; // control page byte 4
const TAS: u8 = 0x40; // control page byte 5

/// The pool's soft threshold as the LBP mode page expresses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Threshold {
    enabled: bool,
    /// In threshold sets (2^THRESHOLD EXPONENT blocks).
    count: u32,
    /// Threshold sets in the whole pool.
    sets: u64,
    /// Bytes per threshold set.
    set_bytes: u64,
}

impl Threshold {
    fn from_share(share: f64, capacity: u64, set_bytes: u64) -> Threshold {
        let sets = capacity / set_bytes.max(1);
        let enabled = share < 1.0;
        let count = if enabled {
            (share * sets as f64).round().clamp(0.0, u32::MAX as f64) as u32
        } else {
            0
        };
        Threshold {
            enabled,
            count,
            sets,
            set_bytes,
        }
    }

    fn share(&self) -> f64 {
        if !self.enabled || self.sets == 0 {
            1.0
        } else {
            (self.count as f64 / self.sets as f64).min(1.0)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Values {
    wce: bool,
    /// The caching page can be saved (PS).
    caching_saveable: bool,
    d_sense: bool,
    swp: bool,
    /// `None` for volumes without a pool (no LBP page).
    threshold: Option<Threshold>,
}

/// Bytes per threshold set: 1 MiB, as VPD B2h's THRESHOLD EXPONENT says.
fn threshold_set_bytes(lu: &LogicalUnit) -> u64 {
    let bs = lu.volume.block_size() as u64;
    bs << crate::limits::threshold_exponent(lu.volume.block_size())
}

/// Current (or default) values of every page.
fn values(lu: &LogicalUnit, control: PageControl) -> Values {
    let set_bytes = threshold_set_bytes(lu);
    let pool = lu.pool.as_ref().map(|p| p.soft_threshold());
    let caching_saveable = lu.mode.saved.is_some();
    let kept_threshold =
        pool.map(|(share, capacity)| Threshold::from_share(share, capacity, set_bytes));
    match control {
        PageControl::Default => Values {
            wce: true,
            caching_saveable,
            d_sense: false,
            swp: false,
            threshold: pool.map(|(_, capacity)| {
                Threshold::from_share(DEFAULT_THRESHOLD_SHARE, capacity, set_bytes)
            }),
        },
        // Only the caching page is saveable (the others' saved values are their defaults);
        // the pool keeps the threshold, so the one in effect is the one saved.
        PageControl::Saved => Values {
            wce: lu.mode.saved_write_cache(),
            caching_saveable,
            d_sense: false,
            swp: false,
            threshold: kept_threshold,
        },
        _ => Values {
            wce: lu.mode.write_cache(),
            caching_saveable,
            d_sense: lu.mode.descriptor_sense(),
            swp: lu.mode.write_protected(),
            threshold: kept_threshold,
        },
    }
}

/// The page as MODE SENSE returns it for `control`, or `None` for pages we lack.
fn page(code: u8, subpage: u8, control: PageControl, v: Values) -> Option<Vec<u8>> {
    let changeable = control == PageControl::Changeable;
    if (code, subpage) == (PAGE_INFO_EXCEPTIONS, SUBPAGE_LBP) {
        let t = v.threshold?;
        let mut p = vec![0u8; 24];
        p[0] = 0x40 | code; // SPF: subpage format
        p[1] = subpage;
        p[2..4].copy_from_slice(&20u16.to_be_bytes()); // page length: 24 - 4
                                                       // Byte 4 SITUA = 0: the threshold's unit attention goes to every I_T nexus.
        let d = &mut p[16..24];
        if changeable {
            d[0] = THRESHOLD_ENABLED;
            d[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        } else {
            d[0] = if t.enabled { THRESHOLD_ENABLED } else { 0 } | ARMING_INCREASING;
            d[1] = RESOURCE_USED_LBA_MAPPING;
            d[4..8].copy_from_slice(&t.count.to_be_bytes());
        }
        return Some(p);
    }
    if subpage != 0 {
        return None;
    }
    let flag = |on: bool, bit: u8| if on { bit } else { 0 };
    let p = match code {
        PAGE_ERROR_RECOVERY => {
            let mut p = vec![0u8; 12];
            p[2] = if changeable { 0 } else { 0xc0 }; // AWRE, ARRE
            p
        }
        PAGE_CACHING => {
            let mut p = vec![0u8; 20];
            p[2] = if changeable { WCE } else { flag(v.wce, WCE) };
            p[0] = flag(v.caching_saveable, PS);
            p
        }
        PAGE_CONTROL => {
            let mut p = vec![0u8; 12];
            if changeable {
                p[2] = D_SENSE;
                p[4] = SWP;
            } else {
                p[2] = flag(v.d_sense, D_SENSE);
                // QUEUE ALGORITHM MODIFIER 1: commands run concurrently, unordered.
                p[3] = 0x10;
                p[4] = flag(v.swp, SWP);
                p[5] = TAS;
                // BUSY TIMEOUT PERIOD: unlimited.
                p[8] = 0xff;
                p[9] = 0xff;
            }
            p
        }
        PAGE_INFO_EXCEPTIONS => {
            let mut p = vec![0u8; 12];
            p[2] = if changeable { 0 } else { 0x08 }; // DEXCPT: no exception reporting
            p
        }
        _ => return None,
    };
    let mut p = p;
    p[0] |= code;
    p[1] = (p.len() - 2) as u8;
    Some(p)
}

/// MODE SENSE(6) / (10).
#[allow(clippy::too_many_arguments)]
pub(crate) fn mode_sense(
    lu: &LogicalUnit,
    ten: bool,
    dbd: bool,
    llbaa: bool,
    control: PageControl,
    page_code: u8,
    subpage: u8,
    alloc_len: usize,
) -> Outcome {
    if control == PageControl::Saved && lu.mode.saved.is_none() {
        return Err(SenseReason::SavingParametersNotSupported.into());
    }
    let current = values(lu, control);
    let mut pages = Vec::new();
    let wanted = |code: u8, sub: u8| match (page_code, subpage) {
        (ALL_PAGES, 0x00) => sub == 0,
        (ALL_PAGES, ALL_SUBPAGES) => true,
        (c, ALL_SUBPAGES) => c == code,
        (c, s) => (c, s) == (code, sub),
    };
    for (code, sub) in PAGES {
        if wanted(code, sub) {
            pages.extend(page(code, sub, control, current).unwrap_or_default());
        }
    }
    if pages.is_empty() {
        return Err(match (page_code, subpage) {
            (ALL_PAGES, _) => invalid_cdb(3, None),
            (_, 0x00) => invalid_cdb(2, Some(5)),
            _ => invalid_cdb(3, None),
        });
    }

    let volume = &lu.volume;
    let write_protected = lu.mode.write_protected();
    // DEVICE-SPECIFIC PARAMETER: WP, DPOFUA (we honour DPO and FUA).
    let device_specific = 0x10 | if write_protected { 0x80 } else { 0 };
    let block_descriptor = if dbd {
        Vec::new()
    } else {
        let blocks = volume.num_blocks();
        let block_len = volume.block_size();
        let zero = control == PageControl::Changeable;
        if llbaa {
            let mut d = vec![0u8; 16];
            if !zero {
                d[0..8].copy_from_slice(&blocks.to_be_bytes());
                d[12..16].copy_from_slice(&block_len.to_be_bytes());
            }
            d
        } else {
            let mut d = vec![0u8; 8];
            if !zero {
                // A capacity that does not fit the 3-byte field is reported as all ones.
                let short = u32::try_from(blocks).unwrap_or(u32::MAX).min(0x00ff_ffff);
                d[0..4].copy_from_slice(&short.to_be_bytes());
                d[0] = 0; // density code
                d[4..8].copy_from_slice(&block_len.to_be_bytes());
                d[4] = 0;
            }
            d
        }
    };

    let mut data = Vec::with_capacity(8 + block_descriptor.len() + pages.len());
    if ten {
        let len = (6 + block_descriptor.len() + pages.len()) as u16;
        data.extend_from_slice(&len.to_be_bytes());
        data.push(0); // medium type
        data.push(device_specific);
        data.push(if llbaa && !dbd { 0x01 } else { 0 });
        data.push(0);
        data.extend_from_slice(&(block_descriptor.len() as u16).to_be_bytes());
    } else {
        let len = 3 + block_descriptor.len() + pages.len();
        data.push(u8::try_from(len).unwrap_or(u8::MAX));
        data.push(0);
        data.push(device_specific);
        data.push(block_descriptor.len() as u8);
    }
    data.extend_from_slice(&block_descriptor);
    data.extend_from_slice(&pages);
    Ok(Done::data(truncated(data, alloc_len)))
}

/// MODE SELECT(6) / (10): validate the whole parameter list, then apply it at once.
pub(crate) fn mode_select(
    lu: &LogicalUnit,
    nexus: &Nexus,
    ten: bool,
    save_pages: bool,
    param_len: usize,
    data_out: &[u8],
) -> Outcome {
    if save_pages && lu.mode.saved.is_none() {
        return Err(invalid_cdb(1, Some(0)));
    }
    if param_len == 0 {
        return Ok(Done::good());
    }
    let params = ParamList::new(data_out_prefix(data_out, param_len)?);
    let header_len = if ten { 8 } else { 4 };
    let header = params.sub(0, header_len)?;
    let (descriptor_len, long_lba) = if ten {
        (usize::from(header.be16(6)?), header.u8(4)? & 1 != 0)
    } else {
        (usize::from(header.u8(3)?), false)
    };
    let expected_descriptor = if long_lba { 16 } else { 8 };
    if descriptor_len != 0 && descriptor_len != expected_descriptor {
        return Err(header.invalid(if ten { 6 } else { 3 }, None));
    }
    let pages_at = header_len + descriptor_len;
    if descriptor_len != 0 {
        // The block length must stay ours (we cannot reformat); 0 means "unchanged".
        let d = params.sub(header_len, descriptor_len)?;
        let (block_len, field) = if long_lba {
            (d.be32(12)?, 12)
        } else {
            (d.be24(5)?, 5)
        };
        if block_len != 0 && block_len != lu.volume.block_size() {
            return Err(d.invalid(field, None));
        }
    }

    let _serialized = lock_unpoisoned(&lu.mode.select);
    let current = values(lu, PageControl::Current);
    let mut new = current;
    let mut at = pages_at;
    while at < params.len() {
        let first = params.u8(at)?;
        let code = first & 0x3f;
        // SPF: subpage format, with a 2-byte page length.
        let (subpage, total) = if first & 0x40 != 0 {
            let h = params.sub(at, 4)?;
            (h.u8(1)?, usize::from(h.be16(2)?) + 4)
        } else {
            (0, usize::from(params.u8(at + 1)?) + 2)
        };
        let page_list = params.sub(at, total)?;
        let sent = page_list.bytes();
        let (Some(ours), Some(mask)) = (
            page(code, subpage, PageControl::Current, current),
            page(code, subpage, PageControl::Changeable, current),
        ) else {
            return Err(page_list.invalid(0, None));
        };
        let page_header = if subpage != 0 { 4 } else { 2 };
        if sent.len() != ours.len() {
            return Err(page_list.invalid(1, None));
        }
        // Every bit that is not changeable must equal its current value (PS is ignored).
        for i in page_header..ours.len() {
            if (sent[i] ^ ours[i]) & !mask[i] != 0 {
                return Err(page_list.invalid(i, None));
            }
        }
        match (code, subpage) {
            (PAGE_CACHING, 0) => new.wce = sent[2] & WCE != 0,
            (PAGE_CONTROL, 0) => {
                new.d_sense = sent[2] & D_SENSE != 0;
                new.swp = sent[4] & SWP != 0;
            }
            (PAGE_INFO_EXCEPTIONS, SUBPAGE_LBP) => {
                let mut t = current.threshold.expect("the page exists only with a pool");
                t.enabled = sent[16] & THRESHOLD_ENABLED != 0;
                t.count = page_list.be32(20)?;
                // The pool takes the same range from here as from the API.
                if t.enabled
                    && (t.count == 0
                        || t.count as u64 > t.sets
                        || !sliver_volume::SOFT_THRESHOLD_RANGE.contains(&t.share()))
                {
                    return Err(page_list.invalid(20, None));
                }
                if !t.enabled {
                    t.count = 0;
                }
                new.threshold = Some(t);
            }
            _ => {}
        }
        at += total;
    }

    if save_pages {
        // Every saveable page is saved (SPC-4 MODE SELECT, SP=1): WCE as it now stands.
        // Kept first: a failure changes nothing.
        if new.wce != lu.mode.saved_write_cache() {
            let store = lu.mode.saved.as_ref().expect("checked above");
            store.save_write_cache(new.wce).map_err(|e| {
                tracing::error!("MODE SELECT: the caching page was not saved: {e}");
                Failure::from(SenseReason::InternalTargetFailure)
            })?;
            lu.mode.saved_write_cache.store(new.wce, Ordering::Relaxed);
        }
    }
    if new != current {
        // The pool's owner keeps the threshold (a write of the array's configuration): done
        // first, so that a failure leaves every other parameter as it was.
        if let Some(t) = new.threshold.filter(|_| new.threshold != current.threshold) {
            let pool = lu.pool.as_ref().expect("the page exists only with a pool");
            pool.set_soft_threshold(t.share()).map_err(|e| {
                tracing::error!("MODE SELECT: the soft threshold was not changed: {e}");
                Failure::from(SenseReason::InternalTargetFailure)
            })?;
        }
        lu.mode.write_cache.store(new.wce, Ordering::Relaxed);
        lu.mode
            .descriptor_sense
            .store(new.d_sense, Ordering::Relaxed);
        lu.mode.write_protect.store(new.swp, Ordering::Relaxed);
        // The parameters are in effect now: the other initiators learn of it even if the
        // flush below fails.
        lu.unit_attention_all(SenseReason::ModeParametersChanged, Some(nexus));
        if !new.wce {
            // Turning the write cache off must not leave earlier writes volatile.
            lu.volume.flush().map_err(crate::outcome::write_failure)?;
        }
    }
    Ok(Done::good())
}

impl LogicalUnit {
    /// This LU with `write_cache` as its saved and current WCE, the caching page saveable
    /// through `saved` (which already holds `write_cache`).
    pub fn with_saved_mode_pages(
        mut self,
        write_cache: bool,
        saved: std::sync::Arc<dyn SavedModePages>,
    ) -> Self {
        self.mode.write_cache.store(write_cache, Ordering::Relaxed);
        self.mode
            .saved_write_cache
            .store(write_cache, Ordering::Relaxed);
        self.mode.saved = Some(saved);
        self
    }

    /// WCE now: writes are answered before they are durable (write-back).
    pub fn write_cache(&self) -> bool {
        self.mode.write_cache()
    }

    /// WCE as saved: what the LU starts with.
    pub fn saved_write_cache(&self) -> bool {
        self.mode.saved_write_cache()
    }

    /// Change WCE as an administrator does (the array has kept the setting already): the
    /// current and saved values, a MODE PARAMETERS CHANGED unit attention for every nexus,
    /// and, when the cache turns off, every write answered before made durable, so that
    /// nothing acknowledged under write-back stays volatile once the volume says
    /// write-through.
    pub fn set_write_cache(&self, write_cache: bool) -> sliver_volume::Result<()> {
        let _serialized = lock_unpoisoned(&self.mode.select);
        self.mode
            .saved_write_cache
            .store(write_cache, Ordering::Relaxed);
        if self.mode.write_cache.swap(write_cache, Ordering::Relaxed) != write_cache {
            self.unit_attention_all(SenseReason::ModeParametersChanged, None);
        }
        if !write_cache {
            self.volume.flush()?;
        }
        Ok(())
    }
}

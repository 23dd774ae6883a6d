//! Raw mode: UNMAP a block range of an iSCSI LUN with a chosen number of blocks per command
//! (the `esxcli storage vmfs unmap -n` experiment), optionally rate-limited.

use crate::limiter::{Clock, Limiter, RateSpec};
use sliver_api_types::units::{human_bytes, human_rate};
use sliver_initiator::{cdb, Error, Session, SessionOptions};
use std::sync::atomic::{AtomicBool, Ordering};

/// What to unmap.
#[derive(Debug, Clone)]
pub struct RawRequest {
    pub url: String,
    pub lba: u64,
    pub count: u64,
    pub blocks_per_command: u64,
    pub queue_depth: u32,
    pub initiator_name: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct RawReport {
    pub lun: String,
    pub lba: u64,
    pub count: u64,
    pub blocks_per_command: u64,
    pub block_size: u32,
    pub queue_depth: u32,
    pub commands: u64,
    /// Blocks acknowledged by the target.
    pub blocks_unmapped: u64,
    pub bytes_unmapped: u64,
    pub elapsed_seconds: f64,
    pub achieved_bytes_per_second: f64,
    pub throttled_seconds: f64,
    pub limit: RateSpec,
    pub completed: bool,
}

impl RawReport {
    pub fn text(&self) -> String {
        let limit = self.limit.limit_text();
        format!(
            "{}: UNMAP of {} blocks ({}) from LBA {} in {} commands of up to {} blocks \
             (queue depth {}): {:.3} s, {} ({limit}){}",
            self.lun,
            self.blocks_unmapped,
            human_bytes(self.bytes_unmapped),
            self.lba,
            self.commands,
            self.blocks_per_command,
            self.queue_depth,
            self.elapsed_seconds,
            human_rate(self.achieved_bytes_per_second),
            if self.completed { "" } else { " STOPPED" }
        )
    }
}

fn fail(e: Error) -> String {
    e.to_string()
}

/// Runs the raw UNMAP loop. Every command must complete GOOD; the first that does not ends the
/// run with its sense data in the error.
pub fn run<C: Clock>(
    req: &RawRequest,
    limiter: &mut Limiter<C>,
    stop: &AtomicBool,
) -> Result<RawReport, String> {
    if req.count == 0 {
        return Err("--count must be positive".into());
    }
    if req.blocks_per_command == 0 || req.blocks_per_command > u64::from(u32::MAX) {
        return Err("--blocks-per-command must be in 1..=4294967295".into());
    }
    if req.queue_depth == 0 {
        return Err("--queue-depth must be positive".into());
    }
    let mut s = Session::connect(
        &req.url,
        SessionOptions {
            initiator_name: req.initiator_name.clone(),
            ..SessionOptions::default()
        },
    )
    .map_err(fail)?;
    let cap = s.read_capacity16().map_err(fail)?;
    let end = req
        .lba
        .checked_add(req.count)
        .filter(|e| *e <= cap.blocks())
        .ok_or_else(|| {
            format!(
                "LBA range {}+{} lies beyond the end of the LUN ({} blocks of {} bytes)",
                req.lba,
                req.count,
                cap.blocks(),
                cap.block_size
            )
        })?;
    if !cap.lbpme {
        return Err(format!(
            "{} is not thin provisioned (LBPME=0): the target does not accept UNMAP",
            s.url()
        ));
    }
    if let Ok(limits) = s.block_limits() {
        let max = u64::from(limits.max_unmap_lba_count);
        if max == 0 {
            return Err(format!(
                "{} does not accept UNMAP (MAXIMUM UNMAP LBA COUNT is 0)",
                s.url()
            ));
        }
        if max != u64::from(u32::MAX) && req.blocks_per_command > max {
            return Err(format!(
                "--blocks-per-command {} exceeds the target's MAXIMUM UNMAP LBA COUNT of {max}",
                req.blocks_per_command
            ));
        }
    }
    let bs = u64::from(cap.block_size);
    let start = limiter.clock().now();
    let mut throttled = std::time::Duration::ZERO;
    let mut next = req.lba;
    let mut commands = 0u64;
    let mut acknowledged = 0u64;
    let mut in_flight: std::collections::HashMap<u32, u64> = Default::default();
    let mut stopped = false;
    let collect = |s: &mut Session, in_flight: &mut std::collections::HashMap<u32, u64>| {
        let c = s.wait_any().map_err(fail)?;
        let blocks = in_flight.remove(&c.tag.0).unwrap_or(0);
        if !c.is_good() {
            return Err(format!(
                "UNMAP failed with {}{}",
                sliver_initiator::sense::status::name(c.status),
                c.sense.map(|x| format!(": {x}")).unwrap_or_default()
            ));
        }
        Ok::<u64, String>(blocks)
    };
    while next < end {
        if stop.load(Ordering::Relaxed) {
            stopped = true;
            break;
        }
        let n = (end - next).min(req.blocks_per_command);
        limiter.begin();
        let tag = s
            .submit(cdb::unmap(&[(next, n as u32)]).map_err(fail)?)
            .map_err(fail)?;
        in_flight.insert(tag.0, n);
        commands += 1;
        next += n;
        while in_flight.len() >= req.queue_depth as usize {
            acknowledged += collect(&mut s, &mut in_flight)?;
        }
        // After the wait for a free slot, so the time the target took counts as paid.
        throttled += limiter.consume(n * bs);
    }
    while !in_flight.is_empty() {
        acknowledged += collect(&mut s, &mut in_flight)?;
    }
    let elapsed = limiter.clock().now().saturating_sub(start).as_secs_f64();
    let lun = s.url().to_string();
    s.logout().map_err(fail)?;
    let bytes = acknowledged * bs;
    Ok(RawReport {
        lun,
        lba: req.lba,
        count: req.count,
        blocks_per_command: req.blocks_per_command,
        block_size: cap.block_size,
        queue_depth: req.queue_depth,
        commands,
        blocks_unmapped: acknowledged,
        bytes_unmapped: bytes,
        elapsed_seconds: elapsed,
        achieved_bytes_per_second: if elapsed > 0.0 {
            bytes as f64 / elapsed
        } else {
            f64::INFINITY
        },
        throttled_seconds: throttled.as_secs_f64(),
        limit: limiter.spec(),
        completed: !stopped,
    })
}

//! The array's events: what an administrator asks "what happened?" about (volumes and hosts
//! created, changed and deleted, connections, settings, logins refused, the soft threshold
//! crossed, the engine poisoned), kept in memory for the API and appended to
//! `events.jsonl` in the data directory so they survive restarts.
//!
//! Bounded everywhere: the last [`KEPT`] events in memory; the file is rotated to
//! `events.1.jsonl` past [`FILE_BYTES`] (two files at most); at open only the current file is
//! read, so opening costs at most `FILE_BYTES`. Refused logins repeat as fast as an initiator
//! retries, so one (initiator, reason) is recorded at most once per [`REPEAT_MS`], with the
//! number of attempts folded into the next one. The file is written without fsync: an event
//! lost in a crash costs a line of history, never data, and the I/O path never waits for it.

use serde::Serialize;
// An event is the API's JSON type; the events file holds the same lines.
pub use sliver_api_types::{Event, Severity};
use std::collections::{HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};

/// Events kept in memory.
pub const KEPT: usize = 1_000;
/// Size past which the file is rotated.
pub const FILE_BYTES: u64 = 1 << 20;
/// How long a repeated refusal is folded into the one recorded before.
pub const REPEAT_MS: u64 = 10 * 60 * 1000;
/// Refused initiators remembered for the console's "seen but refused" list.
pub const REFUSED_KEPT: usize = 64;

const FILE: &str = "events.jsonl";
const OLD_FILE: &str = "events.1.jsonl";

/// What a caller records: an [`Event`] without its sequence number and time.
#[derive(Clone, Debug, Default)]
pub struct NewEvent {
    pub kind: &'static str,
    pub severity: Option<Severity>,
    pub message: String,
    pub volume: Option<String>,
    pub host: Option<String>,
    pub initiator: Option<String>,
}

/// An initiator that tried to log in and was refused.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RefusedInitiator {
    pub initiator: String,
    pub remote: String,
    pub reason: String,
    pub first_ms: u64,
    pub last_ms: u64,
    pub count: u64,
}

/// The log. Not thread-safe by itself: the array keeps it behind a mutex.
#[derive(Debug)]
pub struct EventLog {
    dir: Option<PathBuf>,
    events: VecDeque<Event>,
    next_seq: u64,
    file: Option<File>,
    file_bytes: u64,
    /// Last recorded time and attempts folded since, by (initiator, reason).
    repeats: HashMap<(String, String), (u64, u64)>,
    refused: VecDeque<RefusedInitiator>,
    /// The last observed state of the soft threshold and of the engine (see
    /// [`EventLog::observe`]).
    threshold_exceeded: Option<bool>,
    poisoned: bool,
}

impl EventLog {
    /// An in-memory log (nothing written).
    pub fn in_memory() -> Self {
        EventLog {
            dir: None,
            events: VecDeque::new(),
            next_seq: 1,
            file: None,
            file_bytes: 0,
            repeats: HashMap::new(),
            refused: VecDeque::new(),
            threshold_exceeded: None,
            poisoned: false,
        }
    }

    /// Opens the log in `dir`, reading the last [`KEPT`] events of its file. Lines that do
    /// not parse (a torn last line after a crash, damage) are skipped and counted in the
    /// returned number, never fatal: the log is history, not state.
    pub fn open(dir: &Path) -> std::io::Result<(Self, usize)> {
        let mut log = EventLog::in_memory();
        log.dir = Some(dir.to_path_buf());
        let mut skipped = 0;
        // The rotated file first: right after a rotation the current one may be empty, and
        // the numbers must continue from the newest event of either.
        for name in [OLD_FILE, FILE] {
            let f = match File::open(dir.join(name)) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if name == FILE {
                log.file_bytes = f.metadata()?.len();
            }
            // A file grown past its bound by hand is read only that far.
            for line in BufReader::new(f.take(FILE_BYTES * 2)).split(b'\n') {
                let line = line?;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match serde_json::from_slice::<Event>(&line) {
                    Ok(e) => {
                        log.next_seq = log.next_seq.max(e.seq + 1);
                        push_bounded(&mut log.events, KEPT, e);
                    }
                    Err(_) => skipped += 1,
                }
            }
        }
        Ok((log, skipped))
    }

    /// Records `e` at `now_ms`; returns its sequence number (`None` when it was folded into
    /// an earlier refusal). A failed write is logged and the event kept in memory.
    pub fn record(&mut self, now_ms: u64, e: NewEvent) -> Option<u64> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let event = Event {
            seq,
            time_ms: now_ms,
            kind: e.kind.to_string(),
            severity: e.severity.unwrap_or(Severity::Info),
            message: e.message,
            volume: e.volume,
            host: e.host,
            initiator: e.initiator,
        };
        if let Err(err) = self.append(&event) {
            tracing::warn!("cannot write the event log: {err}");
        }
        push_bounded(&mut self.events, KEPT, event);
        Some(seq)
    }

    /// Records a refused login, folding repeats of the same (initiator, reason) within
    /// [`REPEAT_MS`] into the next recorded one, and remembers the initiator for
    /// [`EventLog::refused`].
    pub fn login_refused(
        &mut self,
        now_ms: u64,
        initiator: &str,
        remote: &str,
        reason: &str,
    ) -> Option<u64> {
        match self
            .refused
            .iter_mut()
            .find(|r| r.initiator == initiator && r.reason == reason)
        {
            Some(r) => {
                r.last_ms = now_ms;
                r.count += 1;
                r.remote = remote.to_string();
            }
            None => push_bounded(
                &mut self.refused,
                REFUSED_KEPT,
                RefusedInitiator {
                    initiator: initiator.to_string(),
                    remote: remote.to_string(),
                    reason: reason.to_string(),
                    first_ms: now_ms,
                    last_ms: now_ms,
                    count: 1,
                },
            ),
        }
        let key = (initiator.to_string(), reason.to_string());
        let folded = match self.repeats.get_mut(&key) {
            Some((last, folded)) if now_ms.saturating_sub(*last) < REPEAT_MS => {
                *folded += 1;
                return None;
            }
            Some((_, folded)) => std::mem::take(folded),
            None => 0,
        };
        if self.repeats.len() >= 4 * REFUSED_KEPT {
            self.repeats
                .retain(|_, (last, _)| now_ms.saturating_sub(*last) < REPEAT_MS);
        }
        self.repeats.insert(key, (now_ms, 0));
        let also = if folded > 0 {
            format!(" ({folded} more attempts since the last report)")
        } else {
            String::new()
        };
        self.record(
            now_ms,
            NewEvent {
                kind: "login_refused",
                severity: Some(Severity::Warning),
                message: format!("login of {initiator} from {remote} refused: {reason}{also}"),
                initiator: Some(initiator.to_string()),
                ..NewEvent::default()
            },
        )
    }

    /// Records `failures` failed authentications in a row from `remote` (`what`: "wrong
    /// API token", "wrong CHAP response of ..."), and how long its next attempts wait.
    /// Callers record the few that [`crate::throttle::worth_reporting`] picks.
    pub fn failed_logins(
        &mut self,
        now_ms: u64,
        what: &str,
        remote: &str,
        failures: u32,
        initiator: Option<&str>,
    ) -> Option<u64> {
        let delay = crate::throttle::delay_after(failures);
        let slowed = if delay.is_zero() {
            String::new()
        } else {
            format!(
                "; its attempts are slowed down, the next waits {} ms",
                delay.as_millis()
            )
        };
        self.record(
            now_ms,
            NewEvent {
                kind: "authentication_failed",
                severity: Some(Severity::Warning),
                message: format!("{what} from {remote} ({failures} in a row){slowed}"),
                initiator: initiator.map(str::to_string),
                ..NewEvent::default()
            },
        )
    }

    /// Records the changes of states that are sampled rather than reported: the soft
    /// threshold crossed (either way; not at the first observation unless exceeded) and the
    /// engine poisoned (once).
    pub fn observe(
        &mut self,
        now_ms: u64,
        threshold_exceeded: bool,
        used_share: f64,
        poisoned: Option<String>,
    ) {
        let before = self.threshold_exceeded.replace(threshold_exceeded);
        if before != Some(threshold_exceeded) && (before.is_some() || threshold_exceeded) {
            let (kind, severity, text) = if threshold_exceeded {
                ("soft_threshold_crossed", Severity::Warning, "above")
            } else {
                ("soft_threshold_cleared", Severity::Info, "back below")
            };
            self.record(
                now_ms,
                NewEvent {
                    kind,
                    severity: Some(severity),
                    message: format!(
                        "space in use {text} the soft threshold ({:.0} % of capacity used)",
                        used_share * 100.0
                    ),
                    ..NewEvent::default()
                },
            );
        }
        if let (Some(why), false) = (poisoned, self.poisoned) {
            self.poisoned = true;
            self.record(
                now_ms,
                NewEvent {
                    kind: "engine_poisoned",
                    severity: Some(Severity::Error),
                    message: format!("the engine stopped accepting writes: {why}"),
                    ..NewEvent::default()
                },
            );
        }
    }

    /// Events with a sequence number above `after`, oldest first, at most `limit`.
    pub fn after(&self, after: u64, limit: usize) -> Vec<Event> {
        let start = self.events.partition_point(|e| e.seq <= after);
        self.events.range(start..).take(limit).cloned().collect()
    }

    /// The latest `limit` events, oldest first.
    pub fn latest(&self, limit: usize) -> Vec<Event> {
        let start = self.events.len().saturating_sub(limit);
        self.events.range(start..).cloned().collect()
    }

    /// The sequence number the next event will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Initiators refused recently, most recent last.
    pub fn refused(&self) -> Vec<RefusedInitiator> {
        self.refused.iter().cloned().collect()
    }

    /// Forgets a refused initiator (it was added to a host).
    pub fn forget_refused(&mut self, initiator: &str) {
        self.refused.retain(|r| r.initiator != initiator);
    }

    fn append(&mut self, e: &Event) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let mut line = serde_json::to_vec(e).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if self.file_bytes + line.len() as u64 > FILE_BYTES {
            self.file = None;
            std::fs::rename(dir.join(FILE), dir.join(OLD_FILE)).or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
            self.file_bytes = 0;
        }
        if self.file.is_none() {
            self.file = Some(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(dir.join(FILE))?,
            );
        }
        self.file.as_mut().expect("opened").write_all(&line)?;
        self.file_bytes += line.len() as u64;
        Ok(())
    }
}

fn push_bounded<T>(q: &mut VecDeque<T>, cap: usize, x: T) {
    if q.len() == cap {
        q.pop_front();
    }
    q.push_back(x);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: &'static str, message: &str) -> NewEvent {
        NewEvent {
            kind,
            message: message.into(),
            volume: Some("v1".into()),
            ..NewEvent::default()
        }
    }

    #[test]
    fn events_survive_a_restart_and_continue_their_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, skipped) = EventLog::open(dir.path()).unwrap();
        assert_eq!(skipped, 0);
        assert_eq!(
            log.record(1_000, ev("volume_created", "volume v1 created")),
            Some(1)
        );
        assert_eq!(
            log.record(2_000, ev("volume_deleted", "volume v1 deleted")),
            Some(2)
        );
        drop(log);
        // A torn last line (a crash in the middle of a write) is skipped, not fatal.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join(FILE))
            .unwrap();
        f.write_all(b"{\"seq\":3,\"ti").unwrap();
        drop(f);
        let (mut log, skipped) = EventLog::open(dir.path()).unwrap();
        assert_eq!(skipped, 1);
        let all = log.after(0, 100);
        assert_eq!(all.len(), 2);
        assert_eq!((all[1].seq, all[1].kind.as_str()), (2, "volume_deleted"));
        assert_eq!(all[1].volume.as_deref(), Some("v1"));
        assert_eq!(log.record(3_000, ev("host_created", "h")), Some(3));
        assert_eq!(log.after(2, 100).len(), 1);
        assert_eq!(log.after(0, 1).len(), 1);
    }

    #[test]
    fn memory_and_files_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = EventLog::open(dir.path()).unwrap();
        let long = "x".repeat(900);
        for i in 0..(3 * FILE_BYTES / 1000) {
            log.record(i, ev("volume_created", &long));
        }
        assert_eq!(log.after(0, usize::MAX).len(), KEPT);
        let size = |f: &str| std::fs::metadata(dir.path().join(f)).unwrap().len();
        assert!(size(FILE) <= FILE_BYTES && size(OLD_FILE) <= FILE_BYTES);
        let files = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(files, 2);
        // Reopened: the newest events, numbers continued.
        let next = log.next_seq();
        drop(log);
        let (log, _) = EventLog::open(dir.path()).unwrap();
        assert_eq!(log.next_seq(), next);
    }

    #[test]
    fn sampled_states_are_recorded_when_they_change() {
        let mut log = EventLog::in_memory();
        log.observe(0, false, 0.1, None);
        assert!(
            log.after(0, 10).is_empty(),
            "nothing to say at the first look"
        );
        log.observe(1, true, 0.85, None);
        log.observe(2, true, 0.86, None);
        log.observe(3, false, 0.5, Some("disk failed".into()));
        log.observe(4, false, 0.5, Some("disk failed".into()));
        let kinds: Vec<String> = log.after(0, 10).into_iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            [
                "soft_threshold_crossed",
                "soft_threshold_cleared",
                "engine_poisoned"
            ]
        );
        assert!(log.after(0, 10)[0].message.contains("85 %"));
        let mut fresh = EventLog::in_memory();
        fresh.observe(0, true, 0.9, None);
        assert_eq!(
            fresh.after(0, 10).len(),
            1,
            "exceeded at start is worth a line"
        );
    }

    #[test]
    fn repeated_refusals_are_folded_and_counted() {
        let mut log = EventLog::in_memory();
        let iqn = "iqn.1998-01.com.vmware:esx7";
        assert!(log
            .login_refused(0, iqn, "10.0.0.7:5000", "unknown initiator")
            .is_some());
        for t in 1..=50 {
            assert!(log
                .login_refused(t * 1000, iqn, "10.0.0.7:5001", "unknown initiator")
                .is_none());
        }
        // Another initiator is reported at once.
        assert!(log
            .login_refused(60_000, "iqn.x:y", "10.0.0.8:1", "unknown initiator")
            .is_some());
        let e = log
            .login_refused(REPEAT_MS + 1, iqn, "10.0.0.7:5002", "unknown initiator")
            .unwrap();
        let last = log.after(e - 1, 1).pop().unwrap();
        assert!(
            last.message.contains("50 more attempts"),
            "{}",
            last.message
        );
        assert_eq!(last.severity, Severity::Warning);
        let refused = log.refused();
        assert_eq!(refused.len(), 2);
        assert_eq!((refused[0].count, refused[0].last_ms), (52, REPEAT_MS + 1));
        log.forget_refused(iqn);
        assert_eq!(log.refused().len(), 1);
        for i in 0..(REFUSED_KEPT + 10) {
            log.login_refused(i as u64, &format!("iqn.x:{i}"), "r", "unknown initiator");
        }
        assert_eq!(log.refused().len(), REFUSED_KEPT);
    }
}

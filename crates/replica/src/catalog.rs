//! The catalog of a copy (RFC 0003, "Restore points and retention"): restore points and the
//! index of complete bases, each a small object of its own, and the retention plan that decides
//! which stream objects no restore needs. Sans-I/O apart from [`load`].
//!
//! ```text
//! bases/<start>   version u8 = 1 | continues u8 | pad [2] | record u32 | start u64 | end u64
//!                 | bytes u64
//!   the base whose start record is record `record` of stream object `start` and whose end
//!   record is in object `end`; `bytes` is what its base records held
//! points/<n>      version u8 = 1 | scheduled u8 | name length u16 | base record u32
//!                 | time (ms since 1970) u64 | through u64 | base start u64 | name
//!   the array as stream objects up to `through` left it, built on the base that starts at
//!   record `base record` of object `base start`; every write acknowledged before `time` is in it
//! pins/<n>        version u8 = 1 | pad [7] | expires (ms since 1970) u64 | first u64
//!                 | through u64
//!   an array restored on demand still fetches from stream objects `first..=through`; kept
//!   until it expires (the restored array renews it while it hydrates and deletes it after)
//! ```
//!
//! What a restore needs: for a point, the objects from its base's start through `through`; for
//! the newest state, the objects from the newest complete base's start to the end. Retention
//! deletes the stream objects in neither, the points past the count kept, and the index
//! entries of bases no kept point builds on.

use crate::object::{self, Expected, Kind, ObjectName};
use crate::store::{ObjectStore, StoreError};
use std::ops::Range;
use std::time::Duration;

const VERSION: u8 = 1;
const BASE_BYTES: usize = 32;
const POINT_HEAD: usize = 32;
/// The longest point name.
pub const NAME_MAX: usize = 64;
/// Names the array gives to scheduled points start with this; users' names may not.
pub const SCHEDULED_PREFIX: &str = "auto-";

/// A complete base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseEntry {
    /// The stream object and the record in it where the base starts.
    pub start: u64,
    pub record: u32,
    /// The stream object holding its end record.
    pub end: u64,
    /// Whether the stream before it is whole (a scheduled base).
    pub continues: bool,
    /// Bytes its base records held (what the next scheduled base is weighed against).
    pub bytes: u64,
}

/// A restore point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// Its object's number (points are numbered in the order they were taken).
    pub number: u64,
    pub name: String,
    /// Taken on the schedule (and deleted by retention) rather than by a user.
    pub scheduled: bool,
    /// Milliseconds since 1970: every write acknowledged before then is in the point.
    pub time_ms: u64,
    /// The last stream object the point needs.
    pub through: u64,
    /// Where the base it builds on starts.
    pub base: u64,
    pub base_record: u32,
}

impl Point {
    /// The stream objects a restore to this point reads.
    pub fn needs(&self) -> Range<u64> {
        self.base..self.through.saturating_add(1)
    }
}

/// A catalog object that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CatalogError(pub String);

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

impl BaseEntry {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(BASE_BYTES);
        out.push(VERSION);
        out.push(u8::from(self.continues));
        out.extend_from_slice(&[0; 2]);
        out.extend_from_slice(&self.record.to_le_bytes());
        out.extend_from_slice(&self.start.to_le_bytes());
        out.extend_from_slice(&self.end.to_le_bytes());
        out.extend_from_slice(&self.bytes.to_le_bytes());
        out
    }

    pub fn decode(body: &[u8]) -> Result<BaseEntry, CatalogError> {
        let bad = |what: &str| Err(CatalogError(format!("base index entry: {what}")));
        if body.len() != BASE_BYTES {
            return bad("wrong length");
        }
        if body[0] != VERSION {
            return bad("unknown version");
        }
        if body[1] > 1 || body[2..4] != [0; 2] {
            return bad("unknown flags");
        }
        let e = BaseEntry {
            continues: body[1] == 1,
            record: u32_at(body, 4),
            start: u64_at(body, 8),
            end: u64_at(body, 16),
            bytes: u64_at(body, 24),
        };
        if e.start == 0 || e.end < e.start {
            return bad("ends before it starts");
        }
        Ok(e)
    }
}

/// Whether `name` may name a point a user takes: 1 to 64 letters, digits, `.`, `_`, `-` or
/// `:`, not starting with the scheduled points' prefix.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(format!(
            "a restore point's name is 1 to {NAME_MAX} characters"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
    {
        return Err(format!(
            "{name:?}: a restore point's name holds letters, digits, '.', '_', '-' and ':' only"
        ));
    }
    if name.starts_with(SCHEDULED_PREFIX) {
        return Err(format!(
            "{name:?}: names starting with {SCHEDULED_PREFIX:?} are the array's scheduled points"
        ));
    }
    Ok(())
}

/// The name of a scheduled point taken at `time_ms`: "auto-" and the UTC time.
pub fn scheduled_name(time_ms: u64) -> String {
    format!("{SCHEDULED_PREFIX}{}", utc(time_ms))
}

/// `time_ms` as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, proleptic Gregorian).
pub fn utc(time_ms: u64) -> String {
    let secs = time_ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl Point {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(POINT_HEAD + self.name.len());
        out.push(VERSION);
        out.push(u8::from(self.scheduled));
        out.extend_from_slice(&(self.name.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.base_record.to_le_bytes());
        out.extend_from_slice(&self.time_ms.to_le_bytes());
        out.extend_from_slice(&self.through.to_le_bytes());
        out.extend_from_slice(&self.base.to_le_bytes());
        out.extend_from_slice(self.name.as_bytes());
        out
    }

    pub fn decode(number: u64, body: &[u8]) -> Result<Point, CatalogError> {
        let bad = |what: &str| Err(CatalogError(format!("restore point {number}: {what}")));
        if body.len() < POINT_HEAD {
            return bad("truncated");
        }
        if body[0] != VERSION {
            return bad("unknown version");
        }
        if body[1] > 1 {
            return bad("unknown flags");
        }
        let len = u16::from_le_bytes([body[2], body[3]]) as usize;
        if len == 0 || len > NAME_MAX || body.len() != POINT_HEAD + len {
            return bad("name length does not match");
        }
        let Ok(name) = std::str::from_utf8(&body[POINT_HEAD..]) else {
            return bad("name is not UTF-8");
        };
        let scheduled = body[1] == 1;
        if scheduled != name.starts_with(SCHEDULED_PREFIX)
            || (!scheduled && check_name(name).is_err())
        {
            return bad("name does not fit its kind");
        }
        let p = Point {
            number,
            name: name.to_string(),
            scheduled,
            base_record: u32_at(body, 4),
            time_ms: u64_at(body, 8),
            through: u64_at(body, 16),
            base: u64_at(body, 24),
        };
        if p.base == 0 || p.through < p.base {
            return bad("needs objects that end before they start");
        }
        Ok(p)
    }
}

const PIN_BYTES: usize = 32;

/// Stream objects a restore in progress still needs (an array restored on demand fetching
/// its data): the source's retention keeps them until the pin expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    pub number: u64,
    pub expires_ms: u64,
    pub first: u64,
    pub through: u64,
}

impl Pin {
    pub fn needs(&self) -> Range<u64> {
        self.first..self.through.saturating_add(1)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(PIN_BYTES);
        out.push(VERSION);
        out.extend_from_slice(&[0; 7]);
        out.extend_from_slice(&self.expires_ms.to_le_bytes());
        out.extend_from_slice(&self.first.to_le_bytes());
        out.extend_from_slice(&self.through.to_le_bytes());
        out
    }

    pub fn decode(number: u64, body: &[u8]) -> Result<Pin, CatalogError> {
        let bad = |what: &str| Err(CatalogError(format!("pin {number:016x}: {what}")));
        if body.len() != PIN_BYTES {
            return bad("not 32 bytes");
        }
        if body[0] != VERSION || body[1..8] != [0; 7] {
            return bad("unknown version or padding set");
        }
        let p = Pin {
            number,
            expires_ms: u64_at(body, 8),
            first: u64_at(body, 16),
            through: u64_at(body, 24),
        };
        if p.first == 0 || p.through < p.first {
            return bad("needs objects that end before they start");
        }
        Ok(p)
    }
}

/// How long a pin holds without being renewed: an array restored on demand and then left
/// off this long may find objects it still needs deleted by the source's retention.
pub const PIN_LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);

/// Create or renew `pin` in `store`: it expires [`PIN_LIFETIME`] after `now_ms` (the
/// caller's calendar time, milliseconds since 1970).
pub fn put_pin(
    store: &dyn ObjectStore,
    pool: [u8; 16],
    pin: &Pin,
    now_ms: u64,
) -> Result<(), StoreError> {
    let pin = Pin {
        expires_ms: now_ms + PIN_LIFETIME.as_millis() as u64,
        ..*pin
    };
    let name = ObjectName::new(Kind::Pin, pin.number).to_string();
    store.put(
        &name,
        object::encode(Kind::Pin, pool, 0, pin.number, &pin.encode()),
    )
}

/// The pins in `store` that have not expired at `now_ms` (damaged ones are ignored: a pin
/// only ever keeps objects), and the numbers of those that have.
pub fn load_pins(store: &dyn ObjectStore, now_ms: u64) -> Result<(Vec<Pin>, Vec<u64>), StoreError> {
    let mut live = Vec::new();
    let mut expired = Vec::new();
    for n in numbers(store, Kind::Pin)? {
        let name = ObjectName::new(Kind::Pin, n).to_string();
        let bytes = match store.get(&name) {
            Ok(b) => b,
            // Deleted meanwhile (its restore finished).
            Err(StoreError::NotFound { .. }) => continue,
            Err(e) => return Err(e),
        };
        let Ok(h) = object::decode_header(&name, &bytes) else {
            continue;
        };
        let expected = Expected {
            array: h.array,
            kind: Kind::Pin,
            number: n,
        };
        let Ok((_, body)) = object::decode(&name, &bytes, &expected) else {
            continue;
        };
        match Pin::decode(n, body) {
            Ok(p) if p.expires_ms > now_ms => live.push(p),
            Ok(p) => expired.push(p.number),
            Err(_) => {}
        }
    }
    Ok((live, expired))
}

/// The points retention keeps: every named one and the newest `keep_scheduled` scheduled ones.
pub fn kept(points: &[Point], keep_scheduled: usize) -> Vec<&Point> {
    let mut scheduled: Vec<&Point> = points.iter().filter(|p| p.scheduled).collect();
    // By number, the order they were taken in: a clock stepped back cannot reorder them.
    scheduled.sort_by_key(|p| std::cmp::Reverse(p.number));
    let mut out: Vec<&Point> = points.iter().filter(|p| !p.scheduled).collect();
    out.extend(scheduled.into_iter().take(keep_scheduled));
    out
}

/// What retention deletes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Point numbers.
    pub points: Vec<u64>,
    /// Stream object numbers, as ranges.
    pub stream: Vec<Range<u64>>,
    /// Base index entries, by start.
    pub bases: Vec<u64>,
}

/// Merge ranges into a sorted list of disjoint ones.
pub fn merge(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.retain(|r| r.start < r.end);
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

/// `have` minus `need` (both sorted and disjoint, as [`merge`] leaves them).
pub fn subtract(have: &[Range<u64>], need: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    for h in have {
        let mut at = h.start;
        for n in need {
            if n.end <= at || n.start >= h.end {
                continue;
            }
            if n.start > at {
                out.push(at..n.start);
            }
            at = at.max(n.end);
            if at >= h.end {
                break;
            }
        }
        if at < h.end {
            out.push(at..h.end);
        }
    }
    out
}

/// The newest complete base: the one that starts last.
pub fn newest_base(bases: &[BaseEntry]) -> Option<&BaseEntry> {
    bases.iter().max_by_key(|b| (b.start, b.record))
}

/// What no restore needs, given the stream objects the store holds (`have`, sorted and
/// disjoint), the complete bases, the points and the ranges restores in progress pinned. With no complete base nothing in the stream
/// is deleted: the newest state then needs all of it.
pub fn plan(
    have: &[Range<u64>],
    bases: &[BaseEntry],
    points: &[Point],
    keep_scheduled: usize,
    pinned: &[Range<u64>],
) -> Plan {
    let keep = kept(points, keep_scheduled);
    let mut plan = Plan {
        points: points
            .iter()
            .filter(|p| !keep.iter().any(|k| k.number == p.number))
            .map(|p| p.number)
            .collect(),
        ..Plan::default()
    };
    let Some(newest) = newest_base(bases) else {
        return plan;
    };
    let mut need: Vec<Range<u64>> = keep.iter().map(|p| p.needs()).collect();
    need.push(newest.start..u64::MAX);
    need.extend(pinned.iter().cloned());
    plan.stream = subtract(have, &merge(need));
    plan.bases = bases
        .iter()
        .filter(|b| b.start != newest.start && !keep.iter().any(|p| p.base == b.start))
        .map(|b| b.start)
        .collect();
    plan
}

/// Stream object numbers as sorted, disjoint ranges.
pub fn ranges(mut numbers: Vec<u64>) -> Vec<Range<u64>> {
    numbers.sort_unstable();
    numbers.dedup();
    merge(numbers.into_iter().map(|n| n..n + 1).collect())
}

/// The catalog as a store holds it.
#[derive(Debug, Clone, Default)]
pub struct Catalog {
    /// The pool the objects belong to (from the newest stream object).
    pub pool: Option<[u8; 16]>,
    /// Stream objects held.
    pub stream: Vec<Range<u64>>,
    pub bases: Vec<BaseEntry>,
    /// Points, oldest first.
    pub points: Vec<Point>,
    /// Catalog objects that did not decode (reported, never used).
    pub damaged: Vec<String>,
    /// The highest point number listed, damaged points included: the next point is numbered
    /// above it (reusing a damaged point's number would look like another writer's).
    pub last_point_number: u64,
}

fn numbers(store: &dyn ObjectStore, kind: Kind) -> Result<Vec<u64>, StoreError> {
    Ok(store
        .list(kind.folder())?
        .iter()
        .filter_map(|n| ObjectName::parse(n))
        .filter(|n| n.kind == kind)
        .map(|n| n.number)
        .collect())
}

/// Read the catalog: one listing per folder and one small GET per base and point.
pub fn load(store: &dyn ObjectStore) -> Result<Catalog, StoreError> {
    let stream = numbers(store, Kind::Stream)?;
    let mut cat = Catalog {
        stream: ranges(stream.clone()),
        ..Catalog::default()
    };
    let Some(&newest) = stream.iter().max() else {
        return Ok(cat);
    };
    let name = ObjectName::new(Kind::Stream, newest).to_string();
    let head = store.get_range(&name, 0..object::HEADER_BYTES as u64)?;
    let pool = match object::decode_header(&name, &head) {
        Ok(h) => h.array,
        Err(e) => {
            cat.damaged.push(e.to_string());
            return Ok(cat);
        }
    };
    cat.pool = Some(pool);
    let fetch = |kind: Kind, n: u64| -> Result<Result<Vec<u8>, String>, StoreError> {
        let name = ObjectName::new(kind, n).to_string();
        let bytes = match store.get(&name) {
            Ok(b) => b,
            // Deleted between the listing and the read (retention): not there.
            Err(StoreError::NotFound { .. }) => return Ok(Err(String::new())),
            Err(e) => return Err(e),
        };
        let expected = Expected {
            array: pool,
            kind,
            number: n,
        };
        Ok(object::decode(&name, &bytes, &expected)
            .map(|(_, body)| body.to_vec())
            .map_err(|e| e.to_string()))
    };
    for n in numbers(store, Kind::BaseIndex)? {
        match fetch(Kind::BaseIndex, n)? {
            Ok(body) => match BaseEntry::decode(&body) {
                Ok(b) if b.start == n => cat.bases.push(b),
                Ok(_) => cat.damaged.push(format!(
                    "{}: names another start",
                    ObjectName::new(Kind::BaseIndex, n)
                )),
                Err(e) => cat
                    .damaged
                    .push(format!("{}: {e}", ObjectName::new(Kind::BaseIndex, n))),
            },
            Err(e) if e.is_empty() => {}
            Err(e) => cat.damaged.push(e),
        }
    }
    let point_numbers = numbers(store, Kind::Point)?;
    cat.last_point_number = point_numbers.iter().copied().max().unwrap_or(0);
    for n in point_numbers {
        match fetch(Kind::Point, n)? {
            Ok(body) => match Point::decode(n, &body) {
                Ok(p) => cat.points.push(p),
                Err(e) => cat.damaged.push(e.to_string()),
            },
            Err(e) if e.is_empty() => {}
            Err(e) => cat.damaged.push(e),
        }
    }
    cat.bases.sort_by_key(|b| b.start);
    cat.points.sort_by_key(|p| p.number);
    Ok(cat)
}

#[cfg(test)]
#[allow(clippy::single_range_in_vec_init)] // ranges of object numbers, not vectors of numbers
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn point(number: u64, scheduled: bool, base: u64, through: u64) -> Point {
        Point {
            number,
            name: if scheduled {
                scheduled_name(number * 3_600_000)
            } else {
                format!("before-upgrade-{number}")
            },
            scheduled,
            time_ms: number * 3_600_000,
            through,
            base,
            base_record: 0,
        }
    }

    fn base(start: u64, end: u64) -> BaseEntry {
        BaseEntry {
            start,
            record: 2,
            end,
            continues: true,
            bytes: 1 << 30,
        }
    }

    #[test]
    fn entries_round_trip_and_damage_is_refused() {
        let b = base(7, 9);
        assert_eq!(BaseEntry::decode(&b.encode()), Ok(b));
        let p = point(3, false, 7, 12);
        assert_eq!(Point::decode(3, &p.encode()), Ok(p.clone()));
        let s = point(4, true, 7, 12);
        assert_eq!(Point::decode(4, &s.encode()), Ok(s));
        let bytes = p.encode();
        for cut in 0..bytes.len() {
            assert!(Point::decode(3, &bytes[..cut]).is_err(), "cut {cut}");
        }
        let mut bad = bytes.clone();
        bad[1] = 1; // scheduled, but a user's name
        assert!(Point::decode(3, &bad).is_err());
        let mut bad = b.encode();
        bad[16..24].copy_from_slice(&3u64.to_le_bytes()); // ends before it starts
        assert!(BaseEntry::decode(&bad).is_err());
    }

    #[test]
    fn times_print_as_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_795_741_200_000), "2026-11-27T01:00:00Z");
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("before-upgrade_1.2:3").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a b").is_err());
        assert!(check_name("auto-mine").is_err());
        assert!(check_name(&"x".repeat(NAME_MAX + 1)).is_err());
    }

    #[test]
    fn ranges_subtract() {
        let have = ranges(vec![1, 2, 3, 4, 5, 8, 9, 10]);
        assert_eq!(have, vec![1..6, 8..11]);
        assert_eq!(subtract(&have, &[2..4, 9..20]), vec![1..2, 4..6, 8..9]);
        assert_eq!(subtract(&have, &[0..100]), Vec::<Range<u64>>::new());
    }

    #[test]
    fn retention_keeps_what_points_and_the_newest_state_need() {
        // Base 1 (objects 1..=4), points on it through 6 and 9; base 10 (10..=12); point 3
        // through 14 on base 10; stream to 20.
        let have = vec![1..21];
        let bases = [base(1, 4), base(10, 12)];
        let points = [
            point(1, true, 1, 6),
            point(2, true, 1, 9),
            point(3, true, 10, 14),
        ];
        // Keep the newest two scheduled points: point 1 goes, and the objects only it needed.
        let p = plan(&have, &bases, &points, 2, &[]);
        assert_eq!(p.points, vec![1]);
        assert_eq!(p.stream, Vec::<Range<u64>>::new()); // point 2 needs 1..=9, base 10 the rest
        assert_eq!(p.bases, Vec::<u64>::new());
        // Keep one: base 1 and everything before base 10 go.
        let p = plan(&have, &bases, &points, 1, &[]);
        assert_eq!(p.points, vec![1, 2]);
        assert_eq!(p.stream, vec![1..10]);
        assert_eq!(p.bases, vec![1]);
        // A restore in progress pinned 3..=5: those stay.
        let p = plan(&have, &bases, &points, 1, &[3..6]);
        assert_eq!(p.stream, vec![1..3, 6..10]);
        // A named point keeps its objects whatever the count.
        let named = [point(1, false, 1, 6), point(3, true, 10, 14)];
        let p = plan(&have, &bases, &named, 0, &[]);
        assert_eq!(p.points, vec![3]);
        assert_eq!(p.stream, vec![7..10]);
        assert!(p.bases.is_empty());
        // No complete base: nothing in the stream goes.
        assert!(plan(&have, &[], &[], 0, &[]).stream.is_empty());
    }

    #[test]
    fn pins_round_trip_and_refuse_what_is_not_a_pin() {
        let p = Pin {
            number: 0xabc,
            expires_ms: 1_800_000_000_000,
            first: 3,
            through: 9,
        };
        assert_eq!(Pin::decode(0xabc, &p.encode()).unwrap(), p);
        assert_eq!(p.needs(), 3..10);
        let mut bad = p.encode();
        bad[0] = 2;
        assert!(Pin::decode(1, &bad).is_err());
        assert!(Pin::decode(1, &p.encode()[..31]).is_err());
        let backwards = Pin {
            first: 9,
            through: 3,
            ..p
        };
        assert!(Pin::decode(1, &backwards.encode()).is_err());
    }

    proptest! {
        /// Whatever the catalog, retention deletes exactly the objects that neither a kept
        /// point nor the newest state needs.
        #[test]
        fn retention_deletes_what_nothing_needs_and_nothing_else(
            held in proptest::collection::vec(any::<bool>(), 1..60),
            starts in proptest::collection::btree_set(1u64..60, 1..5),
            pts in proptest::collection::vec((any::<bool>(), 0usize..5, 0u64..20), 0..8),
            keep in 0usize..5,
            pins in proptest::collection::vec((1u64..60, 0u64..10), 0..3),
        ) {
            let have = ranges(held.iter().enumerate().filter(|(_, h)| **h).map(|(i, _)| i as u64 + 1).collect());
            let bases: Vec<BaseEntry> = starts.iter().map(|&s| base(s, s + 1)).collect();
            let points: Vec<Point> = pts.iter().enumerate().map(|(i, &(sched, b, extra))| {
                let start = bases[b % bases.len()].start;
                point(i as u64 + 1, sched, start, start + 1 + extra)
            }).collect();
            let pinned: Vec<Range<u64>> = pins.iter().map(|&(a, l)| a..a + l + 1).collect();
            let p = plan(&have, &bases, &points, keep, &pinned);
            let kept = kept(&points, keep);
            let newest = newest_base(&bases).unwrap().start;
            let needed = |n: u64| n >= newest
                || kept.iter().any(|k| k.needs().contains(&n))
                || pinned.iter().any(|r| r.contains(&n));
            let deleted = |n: u64| p.stream.iter().any(|r| r.contains(&n));
            for r in &have {
                for n in r.clone() {
                    prop_assert_eq!(deleted(n), !needed(n), "object {}", n);
                }
            }
            for n in p.stream.iter().flat_map(|r| r.clone()) {
                prop_assert!(have.iter().any(|r| r.contains(&n)), "{} was never held", n);
            }
            for b in &bases {
                let used = b.start == newest || kept.iter().any(|k| k.base == b.start);
                prop_assert_eq!(p.bases.contains(&b.start), !used);
            }
            prop_assert_eq!(p.points.len() + kept.len(), points.len());
        }
    }
}

//! The failed-login slowdown seen from a client: what the API token test and the CHAP test
//! both check of the attempts one address makes (`sliver_server::throttle`).

use sliver_server::throttle::delay_after;
use std::time::Instant;

/// Run `failing(n)` for n = 1..=`failures`, one attempt after the other, each one that must
/// fail; the nth must be answered no sooner than the delay of n - 1 failures after the
/// previous attempt began (the last failure came after that). Only lower bounds: a loaded
/// machine may answer later, never sooner.
pub fn each_attempt_slowed(failures: u32, mut failing: impl FnMut(u32)) {
    let mut previous_start = Instant::now();
    for n in 1..=failures {
        let started = Instant::now();
        failing(n);
        let floor = delay_after(n - 1);
        let since = previous_start.elapsed();
        assert!(
            since >= floor,
            "attempt {n} answered {since:?} after the previous began, under {floor:?}"
        );
        previous_start = started;
    }
}

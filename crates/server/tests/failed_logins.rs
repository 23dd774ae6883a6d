//! Guessing CHAP secrets: wrong responses from one address are slowed down and logged, while
//! a host logging in from another address is not held up (sliver's own initiator, bound to
//! 127.0.0.1 and 127.0.0.2 against a real listener).

use sliver_initiator::{Session, SessionOptions};
use sliver_server::array::ChapSecret;
use sliver_server::throttle::{delay_after, worth_reporting, FREE_FAILURES};
use sliver_test_support::hosts::{iqn, HOST_A};
use sliver_test_support::slowdown::each_attempt_slowed;
use sliver_test_support::target::Running;
use std::time::{Duration, Instant};

const TARGET: &str = "iqn.2026-11.test.sliver:failed-logins";
const SECRET: &str = "correct-horse-battery";

/// Logs in as HOST_A with `secret` from `from`; the result and how long it took.
fn login(t: &Running, secret: &str, from: &str) -> (Result<Session, String>, Duration) {
    let options = SessionOptions {
        initiator_name: HOST_A.into(),
        chap: Some(("alice".into(), secret.into())),
        local_address: Some(from.parse().unwrap()),
        ..Default::default()
    };
    let started = Instant::now();
    let session = Session::connect(&t.url(0), options).map_err(|e| e.to_string());
    (session, started.elapsed())
}

#[test]
fn wrong_chap_responses_are_slowed_and_logged_while_another_address_is_not() {
    let t = Running::start(TARGET, |array| {
        array.create_volume("v", 1 << 20, 512).unwrap();
        array
            .create_host(
                "h",
                vec![iqn(HOST_A)],
                Some(ChapSecret::new("alice", SECRET).unwrap()),
            )
            .unwrap();
        array.connect("v", "h", Some(0)).unwrap();
    });
    // Enough failures that the guessing address's next attempt waits seconds.
    let failures = FREE_FAILURES + 5;
    each_attempt_slowed(failures, |n| {
        let (result, _) = login(&t, "wrong-secret-123", "127.0.0.1");
        assert!(result.is_err(), "attempt {n} with a wrong secret logged in");
    });
    // Another address is not held up by the guessing one (which now waits
    // delay_after(failures), seconds).
    let (good, took) = login(&t, SECRET, "127.0.0.2");
    good.expect("the right secret from another address logs in");
    let bound = delay_after(failures) / 2;
    assert!(
        took < bound,
        "a login from another address took {took:?} (the guessing address waits {:?})",
        delay_after(failures)
    );
    // The failures are in the events, a few lines rather than one per guess.
    let events: Vec<_> = t
        .array
        .events()
        .latest(1000)
        .into_iter()
        .filter(|e| e.kind == "authentication_failed")
        .collect();
    let expected = (1..=failures).filter(|n| worth_reporting(*n)).count();
    assert_eq!(events.len(), expected, "{events:#?}");
    for e in &events {
        assert!(
            e.message
                .starts_with(&format!("wrong CHAP response of {HOST_A} from 127.0.0.1")),
            "{}",
            e.message
        );
        assert_eq!(e.initiator.as_deref(), Some(HOST_A));
    }
    assert!(
        events.last().unwrap().message.contains("slowed down"),
        "{events:#?}"
    );
    // The right secret from the guessing address still logs in, once its turn comes.
    let (right, _) = login(&t, SECRET, "127.0.0.1");
    right.expect("the right secret logs in from the slowed address too");
}

//! Answers given in rounds.
//!
//! A volume that makes writes durable for many commands at once ([`crate::Volume::flush_then`],
//! the engine's group commit) answers them one after another on one thread: a round. A
//! transport that announced each answer to its connection as it came (a wake-up of the
//! connection's task, a socket write) would pay that per command, and the task woken after
//! the first answer would write it alone. Instead it asks for its announcement to run once
//! the round is over ([`at_round_end`]): one write and at most one wake-up per connection
//! per round, with every answer of the round in it.

use std::cell::RefCell;

type Action = Box<dyn FnOnce()>;

thread_local! {
    /// The actions the round running on this thread runs at its end; `None` outside a round.
    static ROUND: RefCell<Option<Vec<Action>>> = const { RefCell::new(None) };
}

/// Run `answer` as one round: actions registered with [`at_round_end`] meanwhile run, in the
/// order registered, once it returns (or unwinds). Every action runs even if one before it
/// panics (an action left out could be a connection's only announcement); the first such
/// panic is raised again after the last, unless the round is already unwinding. A round
/// inside a round is part of the outer one.
pub fn in_round(answer: impl FnOnce()) {
    if running() {
        return answer();
    }
    ROUND.with(|r| *r.borrow_mut() = Some(Vec::new()));
    let _end = RoundEnd;
    answer();
}

/// Whether this thread is answering a round.
pub fn running() -> bool {
    ROUND.with(|r| r.borrow().is_some())
}

/// Run `action` at the end of the round this thread is answering, or now outside a round.
pub fn at_round_end(action: impl FnOnce() + 'static) {
    let action: Action = Box::new(action);
    let now = ROUND.with(|r| match r.borrow_mut().as_mut() {
        Some(actions) => {
            actions.push(action);
            None
        }
        None => Some(action),
    });
    if let Some(action) = now {
        action();
    }
}

/// Ends the round on every way out of [`in_round`]: its actions run outside the borrow, so
/// they may register more (which run now) or start rounds of their own.
struct RoundEnd;

impl Drop for RoundEnd {
    fn drop(&mut self) {
        let actions = ROUND.with(|r| r.borrow_mut().take()).unwrap_or_default();
        let mut first_panic = None;
        for action in actions {
            if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(action)) {
                first_panic.get_or_insert(panic);
            }
        }
        // A second panic while unwinding would abort the process.
        if let Some(panic) = first_panic.filter(|_| !std::thread::panicking()) {
            std::panic::resume_unwind(panic);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    #[test]
    fn actions_wait_for_the_end_of_the_round() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let l = log.clone();
        in_round(|| {
            let a = l.clone();
            at_round_end(move || a.borrow_mut().push("announce 1"));
            l.borrow_mut().push("answer 1");
            let b = l.clone();
            at_round_end(move || b.borrow_mut().push("announce 2"));
            l.borrow_mut().push("answer 2");
        });
        assert_eq!(
            *log.borrow(),
            ["answer 1", "answer 2", "announce 1", "announce 2"]
        );
        assert!(!running());
    }

    #[test]
    fn outside_a_round_actions_run_at_once() {
        let ran = Rc::new(RefCell::new(false));
        let r = ran.clone();
        at_round_end(move || *r.borrow_mut() = true);
        assert!(*ran.borrow());
    }

    #[test]
    fn a_round_nested_in_another_ends_with_it() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let l = log.clone();
        in_round(|| {
            in_round(|| {
                let a = l.clone();
                at_round_end(move || a.borrow_mut().push("announce"));
            });
            l.borrow_mut().push("after the inner round");
            assert!(running());
        });
        assert_eq!(*log.borrow(), ["after the inner round", "announce"]);
    }

    #[test]
    fn every_action_runs_when_one_panics() {
        let log = Rc::new(RefCell::new(Vec::new()));
        let l = log.clone();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            in_round(|| {
                let a = l.clone();
                at_round_end(move || {
                    a.borrow_mut().push("first");
                    panic!("an announcement panicked");
                });
                let b = l.clone();
                at_round_end(move || b.borrow_mut().push("second"));
            })
        }));
        assert!(unwound.is_err(), "the action's panic is raised again");
        assert_eq!(*log.borrow(), ["first", "second"]);
        assert!(!running());
    }

    #[test]
    fn a_round_that_unwinds_still_runs_its_actions() {
        let ran = Rc::new(RefCell::new(false));
        let r = ran.clone();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            in_round(|| {
                at_round_end(move || *r.borrow_mut() = true);
                panic!("an answer panicked");
            })
        }));
        assert!(unwound.is_err());
        assert!(*ran.borrow());
        assert!(!running());
    }
}

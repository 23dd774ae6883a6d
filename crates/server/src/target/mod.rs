//! The target: its portals, its live sessions and its login policy, around the array.
//!
//! `mod.rs` is the [`Server`] and its settings (timeouts, limits, polling); `listener.rs`
//! binds the portals and accepts connections (each counted against the limit, then driven
//! by `crate::connection`); `registry.rs` holds the logged-in sessions (reinstatement, TSIHs,
//! the list the API shows) and the login policy a connection sees ([`ConnectionAuthority`]:
//! discovery, access and CHAP from the array's hosts).

mod listener;
mod registry;

pub(crate) use registry::ConnectionAuthority;
use registry::Registry;
pub use registry::SessionSummary;

use crate::array::{Access, Array, LunMap};
use serde::Serialize;
use sliver_iscsi::{
    Authority, Authorization, ChapCredentials, DiscoveredTarget, LoginStatus, SessionInfo,
    SessionType, TargetSettings,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

/// Open connections the server accepts at once (each is bounded in memory by its negotiated
/// limits and execution budget, so this bounds the whole target). Past it a new connection is
/// closed at once.
pub const MAX_CONNECTIONS: usize = 1024;
/// Logged-in sessions (normal and discovery) at once. A session has one connection, so this
/// is lower than [`MAX_CONNECTIONS`] to leave room for connections still logging in; a login
/// past it fails with OUT OF RESOURCES (status 0302h), which initiators report and retry.
pub const MAX_SESSIONS: usize = 512;

/// How long the server waits for an initiator, by situation. Every one bounds how long a
/// slow or stalled peer can hold a connection slot and what the connection buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// A new connection must complete login within this.
    pub login: Duration,
    /// A logged-in connection that is in the middle of a PDU, owes Data-Out (an R2T or
    /// unsolicited data is outstanding) or leaves a CmdSN gap must send something within
    /// this. Also the longest the socket writer waits for the initiator to take any output
    /// (an initiator that stops reading its socket).
    pub stall: Duration,
    /// Silence after which a logged-in connection gets a NOP-In ping (repeated at this
    /// interval while unanswered). Any PDU from the initiator counts as an answer.
    pub ping_after: Duration,
    /// Silence after which a logged-in connection is closed. Generous on purpose: a
    /// single-threaded initiator (libiscsi's synchronous API) answers pings only when it
    /// next calls in, which can be a minute later; dead peers are found sooner by TCP
    /// keepalive.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            login: Duration::from_secs(30),
            stall: Duration::from_secs(30),
            ping_after: Duration::from_secs(30),
            idle: Duration::from_secs(300),
        }
    }
}

/// What `sliver serve` needs to start the target.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Addresses to listen on for iSCSI; all belong to portal group 1.
    pub portals: Vec<SocketAddr>,
}

/// A running target: the array plus its live sessions.
pub struct Server {
    pub(crate) array: Arc<Array>,
    /// What logins and sessions read of the array (the same array, through its narrow part).
    pub(crate) lun_map: Arc<dyn LunMap>,
    pub(crate) settings: Arc<TargetSettings>,
    /// Slow-loris protection: see [`Timeouts`].
    timeouts: Mutex<Timeouts>,
    /// How long a quiet connection polls its socket before sleeping ([`crate::poll`]), in
    /// microseconds.
    poll_us: AtomicU64,
    /// Open connections, bounded by `max_connections`: past it new ones are closed at once.
    connections: Arc<AtomicUsize>,
    max_connections: AtomicUsize,
    max_sessions: AtomicUsize,
    registry: Mutex<Registry>,
    portals: Mutex<Vec<SocketAddr>>,
    shutdown: watch::Sender<bool>,
    /// Wrong CHAP responses by source address: new connections from an address that keeps
    /// guessing wait before they are served.
    pub(crate) failed_logins: crate::throttle::FailedLogins,
}

impl Server {
    pub fn new(array: Arc<Array>) -> Arc<Self> {
        let mut settings = TargetSettings {
            target_name: array.target_name(),
            ..TargetSettings::default()
        };
        settings.mutual_chap = array.target_chap().map(|c| ChapCredentials {
            user: c.user,
            secret: c.secret.into_bytes(),
        });
        Arc::new(Server {
            lun_map: array.clone(),
            array,
            settings: Arc::new(settings),
            timeouts: Mutex::new(Timeouts::default()),
            poll_us: AtomicU64::new(crate::poll::DEFAULT_POLL.as_micros() as u64),
            connections: Arc::new(AtomicUsize::new(0)),
            max_connections: AtomicUsize::new(MAX_CONNECTIONS),
            max_sessions: AtomicUsize::new(MAX_SESSIONS),
            registry: Mutex::new(Registry::new()),
            portals: Mutex::new(vec![]),
            shutdown: watch::channel(false).0,
            failed_logins: crate::throttle::FailedLogins::new(),
        })
    }

    pub fn array(&self) -> &Arc<Array> {
        &self.array
    }

    /// Change how long a connection may take to log in (default 30 s).
    pub fn set_login_timeout(&self, timeout: Duration) {
        self.timeouts.lock().unwrap().login = timeout;
    }

    /// Change how long a quiet connection polls its socket before it sleeps (zero: never;
    /// at most [`crate::poll::MAX_POLL`]); connections opened later use it.
    pub fn set_poll(&self, window: Duration) {
        let window = window.min(crate::poll::MAX_POLL);
        self.poll_us
            .store(window.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn poll(&self) -> Duration {
        Duration::from_micros(self.poll_us.load(Ordering::Relaxed))
    }

    /// Change every timeout at once; connections opened later use them.
    pub fn set_timeouts(&self, timeouts: Timeouts) {
        *self.timeouts.lock().unwrap() = timeouts;
    }

    pub fn timeouts(&self) -> Timeouts {
        *self.timeouts.lock().unwrap()
    }

    /// Change the most connections open at once (default [`MAX_CONNECTIONS`]).
    pub fn set_max_connections(&self, n: usize) {
        self.max_connections.store(n, Ordering::Relaxed);
    }

    /// Change the most sessions logged in at once (default [`MAX_SESSIONS`]).
    pub fn set_max_sessions(&self, n: usize) {
        self.max_sessions.store(n, Ordering::Relaxed);
    }

    /// TCP connections open now, logged in or not.
    pub fn open_connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Stop accepting and ask every connection to log out and close.
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }
}

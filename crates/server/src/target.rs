//! Portals, the session registry and login policy.

use crate::array::{Access, Array};
use crate::session;
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
}

#[derive(Default)]
struct Registry {
    next_tsih: u16,
    /// Live sessions by (initiator name, ISID): the key of session reinstatement.
    sessions: HashMap<(String, [u8; 6]), SessionHandle>,
}

struct SessionHandle {
    tsih: u16,
    /// Notified to make the owning connection drop (reinstatement).
    kill: Arc<Notify>,
    /// What the API lists.
    summary: SessionSummary,
}

/// A logged-in session as the API and the console show it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SessionSummary {
    pub initiator: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// The host whose initiator names list it, `*` for the wildcard host, or none (a
    /// discovery session of an initiator no host lists cannot log in; this is for a host
    /// deleted or changed after the login).
    pub host: Option<String>,
    /// The initiator session id, hex.
    pub isid: String,
    pub tsih: u16,
    /// `normal` or `discovery`.
    pub kind: &'static str,
    /// The initiator's address and the portal it reached.
    pub remote: String,
    pub portal: String,
    /// Milliseconds since the Unix epoch.
    pub login_ms: u64,
    /// Whether the login authenticated with CHAP.
    pub chap: bool,
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
            array,
            settings: Arc::new(settings),
            timeouts: Mutex::new(Timeouts::default()),
            poll_us: AtomicU64::new(crate::poll::DEFAULT_POLL.as_micros() as u64),
            connections: Arc::new(AtomicUsize::new(0)),
            max_connections: AtomicUsize::new(MAX_CONNECTIONS),
            max_sessions: AtomicUsize::new(MAX_SESSIONS),
            registry: Mutex::new(Registry {
                next_tsih: 1,
                ..Registry::default()
            }),
            portals: Mutex::new(vec![]),
            shutdown: watch::channel(false).0,
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

    /// Sessions logged in now (normal and discovery).
    pub fn session_count(&self) -> usize {
        self.registry.lock().unwrap().sessions.len()
    }

    /// Bind every portal. Returns the bound addresses (port 0 becomes the real port).
    pub async fn bind(&self, options: &ServerOptions) -> std::io::Result<Vec<TcpListener>> {
        let mut listeners = Vec::new();
        let mut bound = Vec::new();
        for addr in &options.portals {
            let l = TcpListener::bind(addr).await.map_err(|e| {
                std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"))
            })?;
            bound.push(l.local_addr()?);
            listeners.push(l);
        }
        *self.portals.lock().unwrap() = bound;
        Ok(listeners)
    }

    pub fn portals(&self) -> Vec<SocketAddr> {
        self.portals.lock().unwrap().clone()
    }

    /// Accept connections on `listeners` until [`Server::shutdown`] is called.
    pub async fn run(self: &Arc<Self>, listeners: Vec<TcpListener>) {
        let mut tasks = tokio::task::JoinSet::new();
        for listener in listeners {
            let server = self.clone();
            tasks.spawn(async move { server.accept_loop(listener).await });
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Stop accepting and ask every connection to log out and close.
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    async fn accept_loop(self: Arc<Self>, listener: TcpListener) {
        let mut shutdown = self.shutdown.subscribe();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let Some(slot) = ConnectionSlot::take(
                            &self.connections,
                            self.max_connections.load(Ordering::Relaxed),
                        ) else {
                            tracing::warn!(%peer, "{} connections open: refusing another",
                                self.max_connections.load(Ordering::Relaxed));
                            drop(stream);
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let server = self.clone();
                        let shutdown = self.shutdown.subscribe();
                        tokio::spawn(async move {
                            // Released on drop, also if the connection task panics.
                            let _slot = slot;
                            session::drive(server, stream, peer, shutdown).await;
                        });
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                },
                // wait_for also sees a shutdown that came before this loop subscribed.
                _ = async { shutdown.wait_for(|stop| *stop).await.is_ok() } => return,
            }
        }
    }

    /// The logged-in sessions, by initiator name and ISID, with the host each belongs to as
    /// the configuration stands now.
    pub fn sessions(&self) -> Vec<SessionSummary> {
        let mut list: Vec<SessionSummary> = self
            .registry
            .lock()
            .unwrap()
            .sessions
            .values()
            .map(|h| h.summary.clone())
            .collect();
        list.sort_by(|a, b| (&a.initiator, &a.isid).cmp(&(&b.initiator, &b.isid)));
        for s in &mut list {
            s.host = self.array.host_of(&s.initiator);
        }
        list
    }

    /// Release a session's registry entry when its connection ends.
    pub(crate) fn unregister(&self, initiator: &str, isid: [u8; 6], tsih: u16) {
        let mut reg = self.registry.lock().unwrap();
        let key = (initiator.to_string(), isid);
        if reg.sessions.get(&key).map(|s| s.tsih) == Some(tsih) {
            reg.sessions.remove(&key);
        }
    }
}

/// One open connection counted against the limit; released when dropped.
struct ConnectionSlot(Arc<AtomicUsize>);

impl ConnectionSlot {
    fn take(count: &Arc<AtomicUsize>, limit: usize) -> Option<Self> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()?;
        Some(Self(count.clone()))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The login policy one connection sees: the server plus that connection's identity.
pub(crate) struct ConnectionAuthority {
    pub server: Arc<Server>,
    pub local: SocketAddr,
    /// The initiator's address, for the refused-login events and the session list.
    pub peer: SocketAddr,
    /// Whether this connection's login was told to authenticate with CHAP.
    pub chap: AtomicBool,
    /// Notified when this connection's session is reinstated elsewhere.
    pub kill: Arc<Notify>,
}

impl ConnectionAuthority {
    fn refused(&self, initiator: &str, reason: &str) {
        self.server.array.events().login_refused(
            crate::array::now_ms(),
            initiator,
            &self.peer.to_string(),
            reason,
        );
    }
}

impl Authority for ConnectionAuthority {
    fn send_targets(&self, initiator_name: &str) -> Vec<DiscoveredTarget> {
        if matches!(self.server.array.access(initiator_name), Access::Unknown) {
            // ESXi discovers before it logs in: this is where an unknown host shows first.
            self.refused(initiator_name, "discovery by an initiator no host lists");
            return vec![];
        }
        let addresses = self
            .server
            .portals()
            .into_iter()
            .map(|p| {
                // A wildcard portal advertises the address this connection reached.
                let ip = if p.ip().is_unspecified() {
                    self.local.ip()
                } else {
                    p.ip()
                };
                format!("{},1", SocketAddr::new(ip, p.port()))
            })
            .collect();
        vec![DiscoveredTarget {
            name: self.server.settings.target_name.clone(),
            addresses,
        }]
    }

    fn authorize(&self, initiator_name: &str, target_name: Option<&str>) -> Authorization {
        if let Some(t) = target_name {
            if t != self.server.settings.target_name {
                return Authorization::NotFound;
            }
        }
        match self.server.array.access(initiator_name) {
            Access::Unknown => {
                self.refused(initiator_name, "no host lists this initiator");
                Authorization::Denied
            }
            Access::Allowed(chap) => {
                self.chap.store(chap.is_some(), Ordering::Relaxed);
                Authorization::Allow {
                    chap: chap.map(|c| ChapCredentials {
                        user: c.user,
                        secret: c.secret.into_bytes(),
                    }),
                }
            }
        }
    }

    fn register_session(&self, info: &SessionInfo) -> Result<u16, LoginStatus> {
        let mut reg = self.server.registry.lock().unwrap();
        let key = (info.initiator_name.clone(), info.isid);
        let limit = self.server.max_sessions.load(Ordering::Relaxed);
        if !reg.sessions.contains_key(&key) && reg.sessions.len() >= limit {
            tracing::warn!(
                initiator = %info.initiator_name,
                "{limit} sessions logged in: refusing another"
            );
            return Err(LoginStatus::OutOfResources);
        }
        if let Some(old) = reg.sessions.remove(&key) {
            tracing::info!(
                initiator = %info.initiator_name,
                tsih = old.tsih,
                "reinstating session: closing the old one"
            );
            old.kill.notify_one();
        }
        let mut tsih = reg.next_tsih;
        // TSIH 0 is reserved; skip values still in use after wrap-around.
        while tsih == 0 || reg.sessions.values().any(|s| s.tsih == tsih) {
            tsih = tsih.wrapping_add(1);
        }
        reg.next_tsih = tsih.wrapping_add(1);
        let summary = SessionSummary {
            initiator: info.initiator_name.clone(),
            alias: info.initiator_alias.clone(),
            host: None,
            isid: info.isid.iter().map(|b| format!("{b:02x}")).collect(),
            tsih,
            kind: match info.session_type {
                SessionType::Discovery => "discovery",
                _ => "normal",
            },
            remote: self.peer.to_string(),
            portal: self.local.to_string(),
            login_ms: crate::array::now_ms(),
            chap: self.chap.load(Ordering::Relaxed),
        };
        reg.sessions.insert(
            key,
            SessionHandle {
                tsih,
                kill: self.kill.clone(),
                summary,
            },
        );
        Ok(tsih)
    }
}

//! The logged-in sessions and the login policy a connection sees.

use super::*;

#[derive(Default)]
pub(super) struct Registry {
    next_tsih: u16,
    /// Live sessions by (initiator name, ISID): the key of session reinstatement.
    sessions: HashMap<(String, [u8; 6]), SessionHandle>,
}

impl Registry {
    /// No sessions yet; the first TSIH is 1 (0 is reserved).
    pub(super) fn new() -> Self {
        Registry {
            next_tsih: 1,
            ..Registry::default()
        }
    }
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
    /// Sessions logged in now (normal and discovery).
    pub fn session_count(&self) -> usize {
        self.registry.lock().unwrap().sessions.len()
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
            s.host = self.lun_map.host_of(&s.initiator);
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
    fn chap_failed(&self, initiator_name: &str) {
        let ip = self.peer.ip();
        let failures = self
            .server
            .failed_logins
            .failed(ip, std::time::Instant::now());
        if crate::throttle::worth_reporting(failures) {
            tracing::warn!(%ip, initiator = initiator_name, failures, "wrong CHAP response");
            self.server.array.events().failed_logins(
                crate::array::now_ms(),
                &format!("wrong CHAP response of {initiator_name}"),
                &ip.to_string(),
                failures,
                Some(initiator_name),
            );
        }
    }

    fn send_targets(&self, initiator_name: &str) -> Vec<DiscoveredTarget> {
        if matches!(self.server.lun_map.access(initiator_name), Access::Unknown) {
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
        match self.server.lun_map.access(initiator_name) {
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
        if self.chap.load(Ordering::Relaxed) {
            self.server.failed_logins.succeeded(self.peer.ip());
        }
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

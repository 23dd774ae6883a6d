//! Portals, the session registry and login policy.

use crate::array::{Access, Array};
use crate::session;
use sliver_iscsi::{
    Authority, Authorization, ChapCredentials, DiscoveredTarget, LoginStatus, SessionInfo,
    TargetSettings,
};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

/// Time a new connection has to complete its login.
const DEFAULT_LOGIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Open connections the server accepts at once (each is bounded in memory by its negotiated
/// limits and execution budget, so this bounds the whole target).
pub const MAX_CONNECTIONS: usize = 1024;

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
    /// A connection must complete login within this time (slow-loris protection).
    login_timeout: Mutex<std::time::Duration>,
    /// Open connections, bounded: past the limit new connections are closed at once.
    connections: Arc<tokio::sync::Semaphore>,
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
            login_timeout: Mutex::new(DEFAULT_LOGIN_TIMEOUT),
            connections: Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS)),
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
    pub fn set_login_timeout(&self, timeout: std::time::Duration) {
        *self.login_timeout.lock().unwrap() = timeout;
    }

    pub(crate) fn login_timeout(&self) -> std::time::Duration {
        *self.login_timeout.lock().unwrap()
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
                        let Ok(permit) = self.connections.clone().try_acquire_owned() else {
                            tracing::warn!(%peer, "{MAX_CONNECTIONS} connections open: refusing another");
                            drop(stream);
                            continue;
                        };
                        let _ = stream.set_nodelay(true);
                        let server = self.clone();
                        let shutdown = self.shutdown.subscribe();
                        tokio::spawn(async move {
                            session::drive(server, stream, peer, shutdown).await;
                            drop(permit);
                        });
                    }
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    }
                },
                _ = shutdown.changed() => return,
            }
        }
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
    /// Notified when this connection's session is reinstated elsewhere.
    pub kill: Arc<Notify>,
}

impl Authority for ConnectionAuthority {
    fn send_targets(&self, initiator_name: &str) -> Vec<DiscoveredTarget> {
        if matches!(self.server.array.access(initiator_name), Access::Unknown) {
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
            Access::Unknown => Authorization::Denied,
            Access::Allowed(chap) => Authorization::Allow {
                chap: chap.map(|c| ChapCredentials {
                    user: c.user,
                    secret: c.secret.into_bytes(),
                }),
            },
        }
    }

    fn register_session(&self, info: &SessionInfo) -> Result<u16, LoginStatus> {
        let mut reg = self.server.registry.lock().unwrap();
        let key = (info.initiator_name.clone(), info.isid);
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
        reg.sessions.insert(
            key,
            SessionHandle {
                tsih,
                kill: self.kill.clone(),
            },
        );
        Ok(tsih)
    }
}

//! Binding the portals and accepting connections.

use super::*;
use crate::connection;

impl Server {
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
                            // An address that keeps failing CHAP waits its turn first.
                            if !server.failed_logins.wait_turn(peer.ip()).await {
                                tracing::debug!(%peer, "too many wrong CHAP responses waiting: closing");
                                return;
                            }
                            connection::drive(server, stream, peer, shutdown).await;
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

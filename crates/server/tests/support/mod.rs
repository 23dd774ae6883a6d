//! Shared by the server's integration tests: an in-process target on a loopback port.

use sliver_server::{Server, ServerOptions};
use std::net::SocketAddr;
use std::sync::Arc;

/// Serve `server` on an ephemeral loopback port from a two-worker runtime whose threads are
/// named `thread_name` (the run loop's thread `{thread_name}-main`). Returns the portal and the
/// thread, which ends after `server.shutdown()`.
pub fn serve_on_loopback(
    server: &Arc<Server>,
    thread_name: &str,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(thread_name)
        .enable_all()
        .build()
        .unwrap();
    let listeners = runtime
        .block_on(server.bind(&ServerOptions {
            portals: vec!["127.0.0.1:0".parse().unwrap()],
        }))
        .unwrap();
    let addr = server.portals()[0];
    let s = server.clone();
    let thread = std::thread::Builder::new()
        .name(format!("{thread_name}-main"))
        .spawn(move || runtime.block_on(s.run(listeners)))
        .unwrap();
    (addr, thread)
}

//! The API's listener: TCP connections, in TLS when the API serves HTTPS. Handshakes run in
//! tasks of their own, so a client that connects and stays silent holds up nobody; the
//! HTTP server only sees finished ones.

use rustls::ServerConfig;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// Longest a client may take from connecting to a finished handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; past that, accepting waits for one to end.
const MAX_HANDSHAKES: usize = 256;
/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// What plain HTTP sent to the HTTPS port is told (with 400 Bad Request).
const USE_HTTPS: &str =
    "This address serves sliver's API over HTTPS only: use https:// instead of http://.\n";

/// One accepted connection.
pub enum ApiStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// Accepts the API's connections: plain ones as they come, or TLS ones once their
/// handshake is done.
pub struct ApiListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(ApiStream, SocketAddr)>,
    accepting: tokio::task::JoinHandle<()>,
}

impl ApiListener {
    /// Serves `listener`, in TLS with `tls` when given. Must run inside a tokio runtime.
    pub fn new(listener: TcpListener, tls: Option<Arc<ServerConfig>>) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let (to_server, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(accept_loop(listener, tls.map(TlsAcceptor::from), to_server));
        Ok(ApiListener {
            local,
            ready,
            accepting,
        })
    }
}

impl Drop for ApiListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for ApiListener {
    type Io = ApiStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (ApiStream, SocketAddr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accepting task ended (it does not, short of a panic): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    to_server: mpsc::Sender<(ApiStream, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of file descriptors or memory: wait rather than spin.
                tracing::warn!("the API cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some(acceptor) = &tls else {
            if to_server.send((ApiStream::Plain(tcp), peer)).await.is_err() {
                return;
            }
            continue;
        };
        let Ok(permit) = handshakes.clone().acquire_owned().await else {
            return;
        };
        let (acceptor, to_server) = (acceptor.clone(), to_server.clone());
        tokio::spawn(async move {
            let finished = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, acceptor)).await;
            drop(permit);
            match finished {
                Ok(Ok(Some(stream))) => {
                    let _ = to_server
                        .send((ApiStream::Tls(Box::new(stream)), peer))
                        .await;
                }
                Ok(Ok(None)) => tracing::debug!(%peer, "plain HTTP sent to the HTTPS API: refused"),
                Ok(Err(e)) => tracing::debug!(%peer, "TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%peer, "no TLS handshake within {HANDSHAKE_TIMEOUT:?}"),
            }
        });
    }
}

/// Errors of one connection that the next accept does not share (as hyper and axum treat
/// them).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// The TLS stream, or `None` when the client spoke something else (answered with
/// [`USE_HTTPS`] if it looks like HTTP).
async fn handshake(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
) -> io::Result<Option<TlsStream<TcpStream>>> {
    let mut first = [0u8; 1];
    if tcp.peek(&mut first).await? == 0 {
        return Ok(None);
    }
    if first[0] == TLS_HANDSHAKE_RECORD {
        return acceptor.accept(tcp).await.map(Some);
    }
    if first[0].is_ascii_uppercase() {
        refuse_plain_http(tcp).await;
    }
    Ok(None)
}

/// Answers [`USE_HTTPS`] to a plain HTTP request. Its header is read first: closing a
/// socket with unread bytes resets the connection, and the client would see the reset
/// rather than the answer.
async fn refuse_plain_http(mut tcp: TcpStream) {
    let mut request = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while request.len() < 16 << 10 && !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => request.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{USE_HTTPS}",
        USE_HTTPS.len()
    );
    if tcp.write_all(answer.as_bytes()).await.is_ok() {
        let _ = tcp.shutdown().await;
        // A body the client still sends: read it away until the client closes.
        let drain = async { while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {} };
        let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
    }
}

impl AsyncRead for ApiStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ApiStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ApiStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ApiStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ApiStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ApiStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ApiStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ApiStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ApiStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ApiStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ApiStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ApiStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ApiStream::Plain(s) => s.is_write_vectored(),
            ApiStream::Tls(s) => s.is_write_vectored(),
        }
    }
}

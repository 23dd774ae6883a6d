//! The socket writer: output the connection loop could not write directly, sent in order.

use super::*;

/// Output smaller than this is topped up with what else is queued before it is written.
pub(super) const COALESCE_BYTES: usize = 256 * 1024;

/// Slices per `writev` (Linux takes up to 1024; a few dozen PDUs' worth is plenty per call).
pub(super) const WRITE_SLICES: usize = 64;

/// Output for the socket writer, with the budget permits of the commands it answers
/// (released once the socket has taken it).
pub(super) type Output = (sliver_iscsi::output::Output, Vec<OwnedSemaphorePermit>);

/// The socket writer: sends output chunks in order. An initiator that takes no bytes at all
/// for `stall` (it stopped reading its socket) gets its connection reset, which ends the
/// connection loop and releases everything the connection holds.
pub(super) async fn write_output(
    shared: Arc<Shared>,
    mut out_rx: mpsc::Receiver<Output>,
    stall: Duration,
    peer: SocketAddr,
) {
    let writer = &shared.writer;
    while let Some((mut chunk, mut permits)) = out_rx.recv().await {
        let mut chunks = 1;
        // Output queued meanwhile goes out in the same system call (its parts are moved, not
        // copied).
        while chunk.len() < COALESCE_BYTES {
            match out_rx.try_recv() {
                Ok((mut next, more)) => {
                    chunk.append(&mut next);
                    permits.extend(more);
                    chunks += 1;
                }
                Err(_) => break,
            }
        }
        while !chunk.is_empty() {
            match tokio::time::timeout(stall, write_some(writer, &chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return,
                Ok(Ok(n)) => chunk.consume(n),
                Err(_) => {
                    tracing::warn!(%peer, "initiator took no output for {stall:?}, resetting the connection");
                    // Unsent data would otherwise linger in the kernel for a peer that never
                    // reads: reset instead of a graceful close.
                    let _ =
                        socket2::SockRef::from(writer.as_ref()).set_linger(Some(Duration::ZERO));
                    return;
                }
            }
        }
        shared.queued.fetch_sub(chunks, Ordering::AcqRel);
        drop(permits);
    }
    let _ = socket2::SockRef::from(writer.as_ref()).shutdown(std::net::Shutdown::Write);
}

/// Writes what the socket takes of `out` (one `writev`) once it is writable.
pub(super) async fn write_some(
    writer: &OwnedWriteHalf,
    out: &sliver_iscsi::output::Output,
) -> std::io::Result<usize> {
    let mut slices = [IoSlice::new(&[]); WRITE_SLICES];
    let n = out.io_slices(&mut slices);
    loop {
        writer.writable().await?;
        match writer.try_write_vectored(&slices[..n]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

//! Checkpoints: the metadata at one log position, so recovery replays only what follows.

use super::*;

impl Engine {
    /// Write a checkpoint of the current state (the log up to it is synced first).
    pub fn checkpoint(&self) -> Result<()> {
        self.check_writable()?;
        let _maintenance = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        self.checkpoint_locked()
    }

    pub(super) fn checkpoint_locked(&self) -> Result<()> {
        let started = Instant::now();
        // Capture under the lock (pointer copies), encode and write outside it: hosts' commands
        // must not wait for a pass over the whole metadata.
        let (image, head, appended) = {
            let m = self.lock_meta();
            (
                checkpoint::Image::capture(&self.geometry, m.head, m.counters, &m.state),
                m.head,
                m.appended,
            )
        };
        let captured = started.elapsed();
        let bytes = image.encode();
        // Release the image before writing: host writes would go on copying the blocks and
        // pages it shares, and chunks only its pages still refer to stay allocated until then.
        let released = image.release(&mut self.lock_meta().state);
        if let Err(e) = released {
            return Err(self.poison(format!("releasing a checkpoint image: {e}")));
        }
        self.flush()?;
        self.backend.store_checkpoint(&bytes).map_err(|e| {
            if out_of_space(&e) {
                // The previous checkpoint and the log after it still recover everything, and
                // segments it needs are not collected until a newer one is written.
                EngineError::NoSpace
            } else {
                self.poison(format!("writing a checkpoint failed: {e}"))
            }
        })?;
        let mut m = self.lock_meta();
        m.checkpoint_seq = head.seq;
        m.appended_at_checkpoint = appended;
        m.checkpointed_at = Instant::now();
        m.checkpoint_len = bytes.len() as u64;
        drop(m);
        tracing::debug!(
            bytes = bytes.len(),
            lock_held_us = captured.as_micros() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "checkpoint written"
        );
        Ok(())
    }
}

//! What the last durable checkpoint covered (RFC 0005 step 7, the checkpointer's state): the
//! log's head in it, the bytes and chunk records appended since, and its generation. One
//! owner, so a checkpoint moves them together: it freezes the counts when it captures the
//! state, and once its root is durable the marks move to what it captured, keeping what was
//! appended meanwhile for the next. They decide when the next checkpoint is due and which
//! sealed segments the collector may take (those no replay needs any more). Lives under the
//! metadata lock; the engine does the I/O.

pub(super) struct CheckpointMarks {
    /// Sequence of the head in the last durable checkpoint: segments older than it hold no
    /// record recovery still needs besides live chunks.
    seq: u64,
    /// The log's appended bytes ([`super::LogHead::appended`]) the last checkpoint captured.
    appended: u64,
    /// Chunk records appended since the last checkpoint captured the state: with many small
    /// (compressible) chunks, the record count bounds replay time before the byte count does.
    records: u64,
    /// Checkpoints written since the array was created: the state in memory names pages of
    /// this generation.
    generation: u64,
}

/// What a checkpoint captured with the state: the log's appended bytes and the records
/// counted up to then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Captured {
    appended: u64,
    records: u64,
}

impl CheckpointMarks {
    /// As open finds them: the checkpoint it opened from at `seq` and `generation`, nothing
    /// appended since.
    pub(super) fn opened(seq: u64, generation: u64) -> Self {
        CheckpointMarks {
            seq,
            appended: 0,
            records: 0,
            generation,
        }
    }

    /// Whether the last checkpoint's head is past a segment of sequence `segment_seq`, so
    /// that replay never reads it.
    pub(super) fn covers(&self, segment_seq: u64) -> bool {
        segment_seq < self.seq
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Count chunk records appended.
    pub(super) fn count_records(&mut self, records: u64) {
        self.records += records;
    }

    /// Whether the log appended up to `appended` since the last checkpoint, or the records
    /// counted, have reached `max_bytes` or `max_records`.
    pub(super) fn log_due(&self, appended: u64, max_bytes: u64, max_records: u64) -> bool {
        appended - self.appended >= max_bytes || self.records >= max_records
    }

    /// What a checkpoint capturing the state now, with the log appended up to `appended`,
    /// covers.
    pub(super) fn capture(&self, appended: u64) -> Captured {
        Captured {
            appended,
            records: self.records,
        }
    }

    /// From now the state in memory names pages of `generation`, whether or not its root is
    /// ever stored: a retry must write under the next one.
    pub(super) fn installed(&mut self, generation: u64) {
        self.generation = generation;
    }

    /// The checkpoint of `captured`, of `generation` and with its head at `seq`, is durable:
    /// what was appended since it captured the state counts towards the next.
    pub(super) fn durable(&mut self, seq: u64, captured: Captured, generation: u64) {
        self.seq = seq;
        self.appended = captured.appended;
        self.records -= captured.records;
        self.generation = generation;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_keeps_what_was_appended_while_it_ran() {
        let mut marks = CheckpointMarks::opened(7, 3);
        assert!(!marks.log_due(0, 100, 10), "nothing appended since open");
        marks.count_records(6);
        assert!(marks.log_due(100, 100, 10), "the bytes reached");
        let captured = marks.capture(100);
        marks.installed(4);
        assert_eq!(marks.generation(), 4);
        // Appended while the checkpoint wrote its pages.
        marks.count_records(5);
        marks.durable(9, captured, 4);
        assert!(marks.covers(8) && !marks.covers(9));
        assert!(!marks.log_due(150, 100, 10), "50 bytes and 5 records since");
        assert!(marks.log_due(200, 100, 10), "100 bytes since the capture");
        marks.count_records(5);
        assert!(marks.log_due(150, 100, 10), "10 records since the capture");
    }

    #[test]
    fn segments_before_the_opened_checkpoint_are_covered() {
        let marks = CheckpointMarks::opened(7, 3);
        assert!(marks.covers(6));
        assert!(!marks.covers(7));
        assert_eq!(marks.generation(), 3);
    }
}

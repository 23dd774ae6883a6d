//! sliver-reclaim (skeleton; being written).

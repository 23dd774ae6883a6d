//! sliver-initiator (skeleton; being written).

//! The engine (work in progress).

//! log (in progress)

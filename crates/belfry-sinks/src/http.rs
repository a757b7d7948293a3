//! http (in progress)

//! body (in progress)

//! How database failures become [`StoreError`]s.
//!
//! The rule that matters: anything that means "the database cannot serve
//! right now" (refused or broken connection, shutdown, restart, too many
//! connections, a pool wait that timed out) is [`StoreError::Unavailable`],
//! which the API answers with 503 and never with a false success. Only
//! what a retry cannot fix (bad stored data, a bug in a statement) is
//! [`StoreError::Internal`].

use std::error::Error as _;

pub(crate) use belfry_store::StoreError;
use tokio_postgres::error::SqlState;

/// Classifies a driver error.
pub(crate) fn db_error(error: tokio_postgres::Error) -> StoreError {
    if let Some(db) = error.as_db_error() {
        let code = db.code().code();
        // 08: connection exception; 53: insufficient resources (too many
        // connections, out of memory or disk); 57P0x: shutdown, crash
        // restart, not yet accepting connections; 25006: a read-only server
        // (a standby now: the primary moved, see `primary`).
        let unavailable = code.starts_with("08")
            || code.starts_with("53")
            || matches!(code, "57P01" | "57P02" | "57P03" | READ_ONLY);
        let message = format!("{} ({code})", db.message());
        return if unavailable {
            StoreError::Unavailable(message)
        } else {
            StoreError::Internal(message)
        };
    }
    if error.is_closed() || is_transport(&error) {
        return StoreError::Unavailable(describe(&error));
    }
    StoreError::Internal(describe(&error))
}

/// The error with its causes: the driver's own text is only the kind
/// ("error performing TLS handshake"); why is in the causes.
pub(crate) fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return format!("{} ({})", db.message(), db.code().code());
    }
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// SQLSTATE `read_only_sql_transaction`.
const READ_ONLY: &str = "25006";

/// Whether `error` is a write refused by a read-only server (its message
/// ends with the code, as [`db_error`] writes it).
pub(crate) fn is_read_only(error: &StoreError) -> bool {
    matches!(error, StoreError::Unavailable(message) if message.ends_with(&format!("({READ_ONLY})")))
}

/// A failure of the connection itself: I/O, connect, timeout.
fn is_transport(error: &tokio_postgres::Error) -> bool {
    let mut source = error.source();
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    let text = error.to_string();
    text.starts_with("error connecting")
        || text.starts_with("error communicating")
        || text.starts_with("timeout")
}

/// Failing to get a connection from the pool always means "not now".
pub(crate) fn pool_error(error: deadpool_postgres::PoolError) -> StoreError {
    match error {
        deadpool_postgres::PoolError::Backend(e) => match db_error(e) {
            StoreError::Internal(message) => StoreError::Unavailable(message),
            other => other,
        },
        other => StoreError::Unavailable(format!("no database connection: {other}")),
    }
}

/// Errors after which the same transaction, run again, can succeed: a
/// concurrent insert of the same new key, a deadlock, a serialization
/// failure.
pub(crate) fn is_retryable(error: &tokio_postgres::Error) -> bool {
    error.code().is_some_and(|code| {
        *code == SqlState::UNIQUE_VIOLATION
            || *code == SqlState::T_R_DEADLOCK_DETECTED
            || *code == SqlState::T_R_SERIALIZATION_FAILURE
    })
}

/// A stored value this build cannot read.
pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Internal(format!("unreadable stored data: {what}"))
}

//! How a failed statement is told as a [`LedgerError`]: with what
//! tokio-postgres' `Display` leaves out, the client's error kept as the
//! source, and whether the connection can still be trusted. Apart because
//! the connections, the operations and the handle all tell failures alike.

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::error::{Severity, SqlState};

use crate::ledger::{LedgerError, StoreError};

/// Why a statement failed, before it is told as a [`LedgerError`].
pub(super) enum Failure {
    Pg(tokio_postgres::Error),
    Ledger(LedgerError),
}

impl Failure {
    pub(super) fn into_ledger(self) -> LedgerError {
        match self {
            Failure::Pg(error) => LedgerError::Unavailable(kept("postgres: ", error)),
            Failure::Ledger(error) => error,
        }
    }

    pub(super) fn is(&self, state: &SqlState) -> bool {
        matches!(self, Failure::Pg(e) if e.code() == Some(state))
    }
}

/// The error with what tokio-postgres' `Display` leaves out: a server
/// error's severity, SQLSTATE and message, a client error's cause.
pub(super) fn describe(error: &tokio_postgres::Error) -> String {
    if let Some(db) = error.as_db_error() {
        return format!("{} {}: {}", db.severity(), db.code().code(), db.message());
    }
    match std::error::Error::source(error) {
        Some(cause) => format!("{error}: {cause}"),
        None => error.to_string(),
    }
}

/// `error`, described after `what` (see [`describe`]), kept as the source.
pub(super) fn kept(what: &str, error: tokio_postgres::Error) -> StoreError {
    StoreError::with_source(format!("{what}{}", describe(&error)), error)
}

/// Whether the connection cannot be trusted with the next request: a
/// client-side failure (I/O, a message it could not read) or a server error
/// that ends the session.
pub(super) fn broken(error: &tokio_postgres::Error) -> bool {
    error
        .as_db_error()
        .is_none_or(|db| matches!(db.parsed_severity(), Some(Severity::Fatal | Severity::Panic)))
}

pub(super) fn no_answer(after: Duration) -> LedgerError {
    LedgerError::Unavailable(format!("postgres: no answer within {after:?}").into())
}

/// The first column of the first row.
pub(super) fn first<T: for<'a> tokio_postgres::types::FromSql<'a>>(
    rows: &[Row],
    what: &str,
) -> Result<T, LedgerError> {
    let row = rows
        .first()
        .ok_or_else(|| LedgerError::Corrupt(format!("postgres: {what} answered no row").into()))?;
    row.try_get(0)
        .map_err(|e| LedgerError::Corrupt(kept(&format!("postgres: {what} answered "), e)))
}

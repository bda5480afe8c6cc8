//! How a failed statement is told as a [`LedgerError`]: the file's path
//! added, an SQLite error kept as the source, and whether the file is
//! corrupt or only unavailable. Apart because opening the file, reading a
//! row and every operation fail alike.

use std::path::Path;

use rusqlite::ErrorCode;

use crate::ledger::{LedgerError, StoreError};

/// Why an operation failed, before the file's path is added.
pub(super) enum Failure {
    Sql(rusqlite::Error),
    Ledger(LedgerError),
}

impl From<rusqlite::Error> for Failure {
    fn from(error: rusqlite::Error) -> Self {
        Failure::Sql(error)
    }
}

impl Failure {
    /// The [`LedgerError`], its message preceded by the file's path; an
    /// SQLite error is kept as its source.
    pub(super) fn at(self, path: &Path) -> LedgerError {
        let path = path.display();
        match self {
            Failure::Ledger(LedgerError::Unavailable(why)) => {
                LedgerError::Unavailable(why.prefixed(path))
            }
            Failure::Ledger(LedgerError::Corrupt(why)) => LedgerError::Corrupt(why.prefixed(path)),
            Failure::Ledger(other) => other,
            Failure::Sql(error) => {
                let corrupt = match &error {
                    rusqlite::Error::SqliteFailure(e, _) => {
                        matches!(e.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
                    }
                    rusqlite::Error::FromSqlConversionFailure(..)
                    | rusqlite::Error::IntegralValueOutOfRange(..)
                    | rusqlite::Error::InvalidColumnType(..) => true,
                    _ => false,
                };
                let kept = StoreError::with_source(format!("{path}: {error}"), error);
                if corrupt { LedgerError::Corrupt(kept) } else { LedgerError::Unavailable(kept) }
            }
        }
    }
}

pub(super) fn corrupt(why: &str) -> Failure {
    Failure::Ledger(LedgerError::Corrupt(why.into()))
}

pub(super) fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

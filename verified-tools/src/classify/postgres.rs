//! `tokio_postgres::Error` (feature `tokio-postgres`): what a PostgreSQL
//! client's failure proves about the statement's effect.

use ::tokio_postgres::error::{DbError, Severity};

use super::{Classify, ErrorClass};

/// What tokio-postgres' error proves: a server error by its SQLSTATE, a
/// client error by the stage where it happened.
///
/// | error | class | why |
/// | --- | --- | --- |
/// | a server error ([`code`](::tokio_postgres::Error::code) is `Some`) | by the SQLSTATE | [`ErrorClass::from_sqlstate`]: `23505` and `23P01` `Conflict`; `40001`, `40P01`, `57014`, `55P03` `NotSent` (rolled back, a retry may succeed); `57P01` and other session ends `Ambiguous`; classes `22`, `23`, `42` and the like `Definitive` |
/// | a server error of severity `FATAL` or `PANIC`, but for the codes raised while connecting or on an idle session | `Ambiguous` | the session ended; it may have ended after a `COMMIT` completed and before its answer was sent |
/// | "error connecting to server" (DNS, TCP connect, connect timeout), "error performing TLS handshake" | `NotSent` | no connection, so no statement was sent |
/// | "authentication error", "invalid connection string", "invalid configuration" | `Definitive` | refused before any statement; the same settings fail again |
/// | "error serializing parameter N", "expected N parameters but got M", "error encoding message to server" | `Definitive` | the statement could not be encoded, so it was never sent (or a `COPY` was aborted and rolled back) |
/// | "error deserializing column N", "invalid column", "query returned an unexpected number of rows/columns" | `Ambiguous` | the statement ran: an `INSERT … RETURNING` read with `query_one` that returned two rows committed both |
/// | "connection closed" ([`is_closed`](::tokio_postgres::Error::is_closed)) | `Ambiguous` | the same error is returned for a request the dead connection never took and for one whose answer never came (a `COMMIT` may have committed) |
/// | "error communicating with the server" (I/O), "unexpected message from server", "error parsing response from server", "timeout waiting for server", anything else | `Ambiguous` | the connection broke or the client lost track mid-exchange |
///
/// tokio-postgres exposes no error kind, so the client errors are told
/// apart by their `Display` text (tokio-postgres 0.7). A text that changes
/// in a later release falls through to `Ambiguous`: a missed proof costs a
/// verifier read, never a duplicate.
///
/// The one provable "not sent" that the error cannot show: a request on a
/// client whose connection is already gone fails at once with "connection
/// closed". A tool that checks [`Client::is_closed`](::tokio_postgres::Client::is_closed)
/// before sending can say [`ErrorClass::NotSent`] itself, with
/// [`Classified`](super::Classified).
///
/// `Display` of a server error is just "db error": the message and the
/// SQLSTATE are in [`as_db_error`](::tokio_postgres::Error::as_db_error)
/// (and `source()`).
impl Classify for ::tokio_postgres::Error {
    /// The class by the table above.
    fn classify(&self) -> ErrorClass {
        if let Some(db) = self.as_db_error() {
            return db_error_class(db);
        }
        // No accessor for the kind: its fixed text (tokio-postgres 0.7's
        // `Display`, without the cause) is what there is.
        let text = self.to_string();
        let starts = |prefix: &str| text.starts_with(prefix);
        if starts("error connecting to server") || starts("error performing TLS handshake") {
            ErrorClass::NotSent
        } else if starts("authentication error")
            || starts("invalid connection string")
            || starts("invalid configuration")
            || starts("error serializing parameter")
            || starts("error encoding message to server")
            || (starts("expected ") && text.contains(" parameters but got "))
        {
            ErrorClass::Definitive
        } else {
            ErrorClass::Ambiguous
        }
    }

    /// The text with its causes: `Display` alone leaves them out.
    fn describe(&self) -> String {
        super::with_sources(self)
    }
}

/// A server error: the SQLSTATE's class, unless the session ended with it.
fn db_error_class(db: &DbError) -> ErrorClass {
    let code = db.code().code();
    let session_ended = matches!(db.parsed_severity(), Some(Severity::Fatal | Severity::Panic));
    if session_ended && !fatal_code_is_proof(code) {
        return ErrorClass::Ambiguous;
    }
    ErrorClass::from_sqlstate(code)
}

/// Whether a `FATAL` with this SQLSTATE still proves what
/// [`ErrorClass::from_sqlstate`] says: codes raised only while connecting
/// (authentication, an unknown database, too many connections, a server
/// starting or stopping) or on an idle session, before any statement of
/// ours ran.
fn fatal_code_is_proof(code: &str) -> bool {
    matches!(code, "3D000" | "53300" | "57P03" | "25P03" | "57P05") || code.starts_with("28")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_connect_time_and_idle_fatals_keep_their_class() {
        for code in ["28P01", "28000", "3D000", "53300", "57P03", "25P03", "57P05"] {
            assert!(fatal_code_is_proof(code), "{code}");
        }
        for code in ["57P01", "57P02", "08P01", "XX000", "53200", "40001", "23505"] {
            assert!(!fatal_code_is_proof(code), "{code}");
        }
    }

    #[test]
    fn client_errors_before_sending_are_told_by_their_text() {
        // A connection string that does not parse: refused before anything.
        let error = "port=notanumber".parse::<::tokio_postgres::Config>().unwrap_err();
        assert_eq!(error.classify(), ErrorClass::Definitive, "{error}");
    }
}

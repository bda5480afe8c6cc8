//! A real PostgreSQL server for the tests: the run's throwaway one, started
//! by `.ci/postgres.sh` (which `.ci/run` sources) and named by
//! `VT_POSTGRES_URL`, or any server that variable points at.

const WHAT: &str = "a PostgreSQL server (VT_POSTGRES_URL)";
const HOW: &str = "run `eval \"$(bash .ci/postgres.sh)\"`, which installs PostgreSQL if needed, \
                   starts a throwaway server on a free loopback port and exports VT_POSTGRES_URL";

/// The run's server (a tokio-postgres connection string or URL), or `None`
/// when there is none ([`super::missing`]).
pub fn url() -> Option<String> {
    if let Ok(url) = std::env::var("VT_POSTGRES_URL")
        && !url.trim().is_empty()
    {
        return Some(url);
    }
    super::missing(WHAT, HOW);
    None
}

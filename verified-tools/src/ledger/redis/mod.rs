//! The Redis ledger (feature `redis`): records in a Redis (or Valkey)
//! server, shared by every process and host that connects to it. The
//! operator's guide (starting Redis, persistence, restarts, memory policy,
//! the keys it writes) is on [`RedisLedger`], where the published docs show
//! it.
//!
//! Every operation is one server-side Lua script, run atomically by Redis in
//! one round trip (`EVALSHA`; the scripts are loaded at connect, and again
//! by the client after a Redis restart empties the script cache).

mod args;
mod reply;
mod retry;
mod scripts;

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Cmd, RedisError, ScriptInvocation, Value};

use self::args::{fence_arg, fingerprint_hex, glob_prefix, millis, token};
use self::reply::{claimed, fenced, held, read_views, resolved, scanned};
use self::retry::{UNDO_FOR, Unanswered, bound, no_answer, retrying, run, unavailable};
use super::store_time::{micros, settle_micros};
use super::{
    Claim, ClaimRequest, End, Fence, Ledger, LedgerError, LedgerFuture, Progress, RecordState,
    RecordView, Resolution,
};
use crate::IdempotencyKey;
use scripts::{
    S_ABANDON, S_CLAIM, S_DISPATCHING, S_FINISH, S_HOLD, S_READ, S_RELEASE, S_RESOLVE, S_WITHDRAW,
    SCRIPTS, script,
};

/// Keys asked of `SCAN` per round trip by [`Ledger::in_doubt`], and records
/// read per `READ` script.
const SCAN_COUNT: usize = 256;

/// A ledger in a Redis (or Valkey) server, shared by every process and host
/// that connects to it with the same prefix.
///
/// - Claims, write-throughs, finishes and abandons are each one Lua script,
///   run atomically by Redis, in one round trip (`EVALSHA`): a successful
///   call costs two, its claim (which records the first attempt) and its
///   finish.
/// - [`hold`](Ledger::hold) (is this fence still the key's holder, and for
///   how long) is one script too, that only reads: `HMGET` of the record's
///   state, fence and lease end, and `TIME` (BENCHMARKS.md has its cost
///   against a raw `HGET`). It is sent without a `#!lua flags=no-writes`
///   line, which would cost the same here and refuse Redis before 7.
/// - Fences come from one counter per prefix (`INCR`), so they grow across
///   all keys and processes.
/// - Leases, settle times and expiries run on Redis's clock (`TIME`).
/// - Completed and settled records expire after the TTL (24 h by default);
///   held and in-doubt records never expire.
/// - A completed call's value is kept as the JSON its
///   [`Codec`](super::Codec) writes; a value without one is recorded as
///   completed without value (a repeat verifies to get it).
/// - [`abandon`](Ledger::abandon) (from a destructor) runs in the background
///   on the current tokio runtime; if it is lost (no runtime, the runtime
///   shutting down, Redis unreachable), the lease ends the hold instead.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use verified_tools::Context;
/// use verified_tools::ledger::RedisLedger;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let ledger = RedisLedger::connect("redis://127.0.0.1:6379/")
///     .await?
///     .with_prefix("billing:")
///     .with_lease(Duration::from_secs(600))
///     .with_ttl(Duration::from_secs(24 * 3600));
/// let cx = Context::new("billing-agent").with_ledger(Arc::new(ledger));
/// # let _ = cx; Ok(()) }
/// ```
///
/// # Starting Redis
///
/// ```text
/// redis-server --port 6379 --appendonly yes --appendfsync always
/// ```
///
/// [Valkey](https://valkey.io) works too (`valkey-server`, same options).
/// Redis 7 is what this is tested with: the scripts read `TIME`, which
/// scripts may do since their effects, not the scripts, are replicated.
///
/// # What the guarantees assume
///
/// - **Persistence: AOF with `appendfsync always`.** Redis acknowledges a
///   script only after its writes reach the disk, so no record that a call
///   was told about is lost in a crash. With `appendfsync everysec` (Redis's
///   default when AOF is on), up to about a second of records can be lost
///   when Redis (or its host) crashes: a lost *in-doubt* record, or a lost
///   hold whose call was dispatching, lets the next call with the key
///   dispatch without verifying first, so it may apply the effect twice
///   (unless the service itself honours the idempotency key); a lost fence
///   counter increment can hand a fence out twice. RDB snapshots alone
///   (`save ...`, no AOF) lose everything since the last snapshot: minutes.
/// - **Restarts.** Records come back from the AOF. A hold whose lease passed
///   while Redis was down is taken over in doubt by the next call, which
///   verifies before it dispatches. Calls made while Redis was down were
///   refused before they dispatched anything (fail closed); calls that were
///   running stop dispatching at their next write-through.
/// - **One instance or a primary, not Redis Cluster.** Each script touches the
///   namespace's fence counter and a record key, which Cluster would place
///   in different slots. With replication, point the ledger at the primary:
///   a failover to a replica that lags loses what the primary had not sent
///   (`WAIT`-less replication is asynchronous).
/// - **Memory: `maxmemory-policy noeviction` or a `volatile-*` policy.**
///   Completed and settled records are written with an expiry (the TTL);
///   held and in-doubt records and the fence counter have none, so a
///   `volatile-*` policy can only ever evict finished records (a repeat of an
///   evicted completed call then runs anew), and `noeviction` refuses new
///   claims when memory is full (the calls are refused: fail closed). Never an
///   `allkeys-*` policy: it could evict a record in doubt or the fence
///   counter.
///
/// # Keys
///
/// With the prefix `vt:` (the default, see [`with_prefix`](Self::with_prefix)):
/// `vt:fence` is the fence counter (an integer, `INCR`ed by every claim, so
/// fences grow across all keys), and `vt:k:<32 hex digits>` is the record of
/// one idempotency key, a hash:
///
/// | field | meaning |
/// |---|---|
/// | `f` | the payload fingerprint (32 hex digits) |
/// | `s` | state: `h` held, `d` in doubt, `s` settled, `c` completed |
/// | `n` | the fence of the (last) hold |
/// | `l` | when the hold's lease ends (Redis `TIME`, µs) |
/// | `a` | attempts dispatched under the key |
/// | `o` | `1` when the last attempt answered OK unconfirmed |
/// | `t` | when the last attempt settles (Redis `TIME`, µs; absent: never) |
/// | `v` | a completed call's value, as JSON (absent: not serializable) |
/// | `c` | how the hold was taken (`f` fresh, `r` taken over), then the token of the claim that took it |
/// | `q` | the token of the last write-through |
/// | `e` | the fence whose finish landed |
/// | `r` | the token of the operator's decision, if one was made |
///
/// # Time
///
/// Leases, settle times and expiries are measured by Redis's clock only (the
/// scripts read `TIME`): hosts with skewed clocks agree. Durations cross the
/// wire, never instants. The ledger needs tokio's real time: its timeouts
/// would fire at once on a paused clock.
///
/// # Failures
///
/// Every operation is bounded: the connection and each answer time out after
/// [`DEFAULT_TIMEOUT`](Self::DEFAULT_TIMEOUT) (see
/// [`connect_with_timeout`](Self::connect_with_timeout)), and a whole
/// operation, its retries included, after twice that (see
/// [`with_retry_for`](Self::with_retry_for)).
///
/// Within that bound an operation rides over what a restart or a failover
/// looks like from the client: a connection reset, refused or closed, a
/// broken pipe, an answer that does not come (the connection is
/// re-established by itself), and Redis's `LOADING` (a restarted server
/// reading its AOF), `TRYAGAIN`, `MASTERDOWN` and `READONLY` (a primary
/// demoted mid-failover): each is sent again, after a pause that doubles from
/// 10 ms up to 250 ms. Any other error (`NOPERM`, `OOM`, a script error) is
/// not retried. A Redis that stays down or silent for the whole bound gives
/// [`LedgerError::Unavailable`], and the engine refuses the call before it
/// dispatches (fail closed). The engine drops a claim or a write-through at
/// its call's deadline, which ends its retries.
///
/// Sending an operation again is safe even when the first try did land and
/// only its answer was lost:
///
/// - a claim carries a random token, kept in the record: sent again, it is
///   answered with the hold it took (the same fence, fresh or resumed), not
///   "in flight" on its own hold;
/// - a write-through writes the same progress again, and a finish that
///   landed is answered done;
/// - a claim whose caller never got its answer (the retries ran out, or the
///   engine dropped it at the call's deadline) is undone in the background
///   by its token: a fresh hold is deleted (its first attempt never went
///   out), a hold taken over goes back in doubt;
/// - a write-through whose caller never got its answer did not dispatch its
///   attempt (the engine halts): the attempt is taken back in the background
///   (the record counts one attempt less), if the record is still that
///   hold's and that write was the last.
///
/// The undoing is retried for 30 seconds on the current tokio runtime; if
/// Redis stays away longer (or the process ends), the record stays as the
/// store has it: a hold that ends with its lease, then is taken over in
/// doubt, with one attempt counted that never left. That is conservative:
/// the next call verifies before it dispatches, with one attempt less.
///
/// # The operator's door
///
/// [`record`](Ledger::record), [`in_doubt`](Ledger::in_doubt) and
/// [`resolve`](Ledger::resolve) are implemented (the `ledger` example of the
/// repository is their command line):
///
/// - A hold past its lease is shown and listed *in doubt*: its holder is
///   presumed dead, and the next call would take the key over to verify, as
///   it does a record in doubt. Its holder's process may be alive, though,
///   only slow: resolve such a record when you know its process is gone.
/// - `record` is one script (`HMGET` and `TIME`, read only).
/// - `in_doubt` is an operator's tool, not for the hot path: it walks the
///   server's keys with `SCAN MATCH <prefix>k:*` (a few hundred per round
///   trip, so Redis never blocks on it), reading the records found with one
///   script per batch, until it has `limit` records in doubt or the scan
///   ends. `SCAN` visits every key of the database, whatever its prefix: on a
///   server of millions of keys, a listing of a few records in doubt takes
///   thousands of round trips. A record created or changed during the scan
///   may be missed: list again.
/// - `resolve` is one script: it changes the record only when it is in
///   doubt. [`Resolution::Applied`] makes it completed without a value (a
///   repeat verifies to obtain the value and never dispatches),
///   [`Resolution::NotApplied`] settled now with no attempt counted (a repeat
///   verifies, then has the key's whole budget); either expires after the
///   TTL, like a finish. It takes a new fence from the counter, so a holder
///   presumed dead that wakes up is fenced ([`LedgerError::Fenced`]): its
///   outcome never overwrites a person's decision.
#[derive(Debug, Clone)]
pub struct RedisLedger {
    conn: ConnectionManager,
    prefix: String,
    lease: Duration,
    ttl: Duration,
    timeout: Duration,
    retry_for: Duration,
}

impl RedisLedger {
    /// The default prefix of the ledger's keys.
    pub const DEFAULT_PREFIX: &'static str = "vt:";
    /// The default timeout of connecting and of each answer; a whole
    /// operation is bounded by twice it.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

    /// Connects to the Redis server at `url`
    /// (`redis://[user:password@]host:port/db`), with the [default
    /// timeout](Self::DEFAULT_TIMEOUT), and loads the scripts.
    /// Fails with [`LedgerError::Unavailable`] if the server cannot be
    /// reached. Afterwards, the connection is re-established by itself.
    ///
    /// Records live 24 hours, keys are leased for 10 minutes, and the keys'
    /// prefix is [`DEFAULT_PREFIX`](Self::DEFAULT_PREFIX).
    ///
    /// ```no_run
    /// use verified_tools::ledger::{Ledger, RedisLedger};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ledger = RedisLedger::connect("redis://127.0.0.1:6379/").await?;
    /// assert_eq!(ledger.lease().as_secs(), 600);
    /// assert_eq!(ledger.prefix(), "vt:");
    /// # Ok(()) }
    /// ```
    pub async fn connect(url: &str) -> Result<Self, LedgerError> {
        Self::connect_with_timeout(url, Self::DEFAULT_TIMEOUT).await
    }

    /// Like [`connect`](Self::connect), with another timeout for connecting
    /// and for each answer (a whole operation, its retries included, is
    /// bounded by twice it): long enough for the server's fsync under load,
    /// short enough that calls are refused promptly when Redis is down.
    pub async fn connect_with_timeout(url: &str, timeout: Duration) -> Result<Self, LedgerError> {
        let client = redis::Client::open(url).map_err(unavailable)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        let connecting = async {
            let mut conn = ConnectionManager::new_with_config(client, config).await?;
            for script in SCRIPTS.iter() {
                script.prepare_invoke().load_async(&mut conn).await?;
            }
            Ok::<_, RedisError>(conn)
        };
        let conn = match tokio::time::timeout(bound(timeout), connecting).await {
            Ok(connected) => connected.map_err(unavailable)?,
            Err(_) => return Err(no_answer(bound(timeout), None)),
        };
        Ok(Self {
            conn,
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            lease: Duration::from_secs(600),
            ttl: Duration::from_secs(24 * 3600),
            timeout,
            retry_for: bound(timeout),
        })
    }

    /// Sets how long one operation may take, its retries of transient
    /// failures included (twice the timeout by default): how long a restart
    /// or a failover of Redis may last before calls are refused. A Redis
    /// that loads a large AOF after a restart, or a Sentinel failover, may
    /// need a few seconds; the engine bounds every operation by its call's
    /// deadline as well.
    pub fn with_retry_for(mut self, retry_for: Duration) -> Self {
        self.retry_for = retry_for;
        self
    }

    /// Sets the prefix of the ledger's keys (`vt:` by default): ledgers with
    /// different prefixes on one server are separate, each with its own
    /// fence counter. Every process sharing the records must use the same.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Sets how long a call may hold a key (10 minutes by default), on
    /// Redis's clock: past it, the next call takes the key over in doubt. It
    /// must outlast every call's deadline
    /// ([`RetryPolicy::call_timeout`](crate::RetryPolicy::call_timeout)): the
    /// engine refuses calls whose deadline is longer.
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets how long completed and settled records are kept (24 hours by
    /// default), as a Redis expiry. Records in doubt never expire.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The prefix of the ledger's keys.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How long completed and settled records are kept.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The timeout of connecting and of each answer.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// How long one operation may take, its retries included.
    pub fn retry_for(&self) -> Duration {
        self.retry_for
    }

    /// The Redis key of the fence counter.
    fn fence_key(&self) -> String {
        format!("{}fence", self.prefix)
    }

    /// The Redis key of one idempotency key's record.
    fn record_key(&self, key: IdempotencyKey) -> String {
        let mut out = String::with_capacity(self.prefix.len() + 34);
        out.push_str(&self.prefix);
        out.push_str("k:");
        out.push_str(key.to_hex().as_str());
        out
    }

    /// The idempotency key of a record's Redis key, if it is one of this
    /// namespace's (another prefix may start with this one: `vt:k:x`).
    fn key_of(&self, name: &[u8]) -> Option<IdempotencyKey> {
        let hex = name.strip_prefix(self.prefix.as_bytes())?.strip_prefix(b"k:")?;
        std::str::from_utf8(hex).ok()?.parse().ok()
    }

    async fn run(&self, invocation: &ScriptInvocation<'_>) -> Result<Value, LedgerError> {
        run(&self.conn, self.retry_for, invocation).await
    }

    /// Runs a read-only command, bounded, retrying transient failures.
    async fn query(&self, cmd: &Cmd) -> Result<Value, LedgerError> {
        retrying(self.retry_for, || {
            let mut conn = self.conn.clone();
            async move { cmd.query_async::<Value>(&mut conn).await }
        })
        .await
    }

    /// Runs a script in the background, retrying for [`UNDO_FOR`]: what a
    /// destructor or a failed operation leaves to be done. Without a
    /// runtime, or if Redis stays away, it is lost, and the record stays
    /// conservative.
    fn spawn(&self, which: usize, keys: Vec<String>, args: Vec<String>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let conn = self.conn.clone();
        runtime.spawn(async move {
            let mut invocation = script(which).prepare_invoke();
            for key in keys {
                invocation.key(key);
            }
            for arg in args {
                invocation.arg(arg);
            }
            let _ = run(&conn, UNDO_FOR, &invocation).await;
        });
    }

    /// The records of `keys`, read in one script at one instant of Redis's
    /// clock; `None` for those that are gone.
    async fn read(&self, keys: &[IdempotencyKey]) -> Result<Vec<Option<RecordView>>, LedgerError> {
        let mut invocation = script(S_READ).prepare_invoke();
        for &key in keys {
            invocation.key(self.record_key(key));
        }
        let reply = self.run(&invocation).await?;
        read_views(&reply, keys)
    }
}

impl Ledger for RedisLedger {
    fn claim(&self, request: ClaimRequest) -> LedgerFuture<'_, Claim> {
        LedgerFuture::boxed(async move {
            let first = request.first;
            let token = token();
            let mut records = vec![self.record_key(request.key)];
            let mut invocation = script(S_CLAIM).prepare_invoke();
            invocation.key(self.fence_key()).key(&records[0]);
            let previous_fingerprint = match request.previous {
                Some((previous, fingerprint)) => {
                    records.push(self.record_key(previous));
                    invocation.key(&records[1]);
                    fingerprint_hex(fingerprint)
                }
                None => String::new(),
            };
            // How a fresh hold and a hold taken over record the token (`c`):
            // ready-made, so that the script compares without concatenating.
            let tokens = [format!("f{token}"), format!("r{token}")];
            invocation
                .arg(fingerprint_hex(request.fingerprint))
                .arg(previous_fingerprint)
                .arg(micros(self.lease))
                .arg(first.attempts)
                .arg(u8::from(first.after_ok))
                .arg(settle_micros(first.settle))
                .arg(&tokens[0])
                .arg(&tokens[1]);
            // Until the caller has the answer, the claim may hold the key
            // for nobody: dropped or failed, it is released by its token.
            let unanswered = Unanswered {
                ledger: self,
                which: S_RELEASE,
                keys: records.clone(),
                args: tokens.to_vec(),
                armed: true,
            };
            let claim = claimed(&self.run(&invocation).await?, &request)?;
            unanswered.answered();
            Ok(claim)
        })
    }

    fn dispatching(
        &self,
        key: IdempotencyKey,
        fence: Fence,
        progress: Progress,
    ) -> LedgerFuture<'_, ()> {
        LedgerFuture::boxed(async move {
            let (record, token) = (self.record_key(key), token());
            let mut invocation = script(S_DISPATCHING).prepare_invoke();
            invocation
                .key(&record)
                .arg(fence_arg(fence))
                .arg(progress.attempts)
                .arg(u8::from(progress.after_ok))
                .arg(settle_micros(progress.settle))
                .arg(&token);
            // A caller without the answer does not dispatch the attempt
            // (the contract): if the write landed, the attempt is taken back.
            let unanswered = Unanswered {
                ledger: self,
                which: S_WITHDRAW,
                keys: vec![record.clone()],
                args: vec![fence_arg(fence), progress.attempts.to_string(), token.clone()],
                armed: true,
            };
            let reply = self.run(&invocation).await?;
            let written = fenced("dispatching", &reply, fence);
            if !matches!(written, Err(LedgerError::Corrupt(_))) {
                unanswered.answered();
            }
            written
        })
    }

    fn finish<'a>(
        &'a self,
        key: IdempotencyKey,
        fence: Fence,
        end: End<'a>,
    ) -> LedgerFuture<'a, ()> {
        // Encoded at once: the future owns what it sends.
        let (state, value) = match end {
            End::Completed(value) => ("c", value.encode()),
            End::Settled => ("s", None),
            End::InDoubt => ("d", None),
        };
        LedgerFuture::boxed(async move {
            let mut invocation = script(S_FINISH).prepare_invoke();
            invocation
                .key(self.record_key(key))
                .arg(fence_arg(fence))
                .arg(state)
                .arg(millis(self.ttl));
            if let Some(value) = value {
                invocation.arg(value);
            }
            fenced("finish", &self.run(&invocation).await?, fence)
        })
    }

    fn abandon(&self, key: IdempotencyKey, fence: Fence) {
        // Called from a destructor: never blocks. Without a runtime, or if
        // the write is lost, the lease ends the hold.
        self.spawn(S_ABANDON, vec![self.record_key(key)], vec![fence_arg(fence)]);
    }

    fn lease(&self) -> Duration {
        self.lease
    }

    /// One script (`HMGET` of three fields, then `TIME` when the fence
    /// holds), retried like every operation: it writes nothing, so sending it
    /// again is harmless.
    fn hold(&self, key: IdempotencyKey, fence: Fence) -> LedgerFuture<'_, Option<Duration>> {
        LedgerFuture::boxed(async move {
            let mut invocation = script(S_HOLD).prepare_invoke();
            invocation.key(self.record_key(key)).arg(fence_arg(fence));
            held(&self.run(&invocation).await?)
        })
    }

    fn record(&self, key: IdempotencyKey) -> LedgerFuture<'_, Option<RecordView>> {
        LedgerFuture::boxed(async move { Ok(self.read(&[key]).await?.pop().flatten()) })
    }

    fn in_doubt(&self, limit: usize) -> LedgerFuture<'_, Vec<RecordView>> {
        LedgerFuture::boxed(async move {
            let mut found: Vec<RecordView> = Vec::new();
            let pattern = glob_prefix(&self.prefix);
            let mut cursor = 0u64;
            while found.len() < limit {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor).arg("MATCH").arg(&pattern).arg("COUNT").arg(SCAN_COUNT);
                let reply = self.query(&scan).await?;
                let (next, names) = scanned(&reply)?;
                // SCAN may return a key twice.
                let keys: Vec<IdempotencyKey> = names
                    .into_iter()
                    .filter_map(|name| self.key_of(name))
                    .filter(|key| !found.iter().any(|view| view.key == *key))
                    .collect();
                if !keys.is_empty() {
                    let views = self.read(&keys).await?.into_iter().flatten();
                    let doubt = views.filter(|view| view.state == RecordState::InDoubt);
                    found.extend(doubt.take(limit - found.len()));
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
            Ok(found)
        })
    }

    fn resolve(
        &self,
        key: IdempotencyKey,
        resolution: Resolution,
    ) -> LedgerFuture<'_, Option<RecordState>> {
        LedgerFuture::boxed(async move {
            let mut invocation = script(S_RESOLVE).prepare_invoke();
            invocation.key(self.fence_key()).key(self.record_key(key));
            let state = match resolution {
                Resolution::Applied => "c",
                Resolution::NotApplied => "s",
            };
            invocation.arg(state).arg(millis(self.ttl)).arg(token());
            resolved(&self.run(&invocation).await?)
        })
    }
}

#[cfg(test)]
mod tests {
    use redis::ErrorKind;

    use super::*;

    /// The client's own error, reached through the `LedgerError`'s source.
    fn redis_source(error: &LedgerError) -> &RedisError {
        let store = std::error::Error::source(error).expect("the StoreError");
        let redis = store.source().expect("the client's error, kept");
        redis.downcast_ref::<RedisError>().expect("a RedisError")
    }

    #[tokio::test]
    async fn a_failure_keeps_the_redis_error_as_its_source() {
        // Refused before any connection: the client reads no URL in it.
        let error = RedisLedger::connect("not a redis url").await.expect_err("not a URL");
        assert!(matches!(error, LedgerError::Unavailable(_)), "{error:?}");
        assert_eq!(redis_source(&error).kind(), ErrorKind::InvalidClientConfig);
        assert!(error.to_string().starts_with("the ledger's store is unavailable: redis: "));

        // A port nobody listens on: the connection is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("redis://127.0.0.1:{port}/");
        let error = RedisLedger::connect_with_timeout(&url, Duration::from_secs(5))
            .await
            .expect_err("nothing listens");
        let redis = redis_source(&error);
        assert!(redis.is_connection_refusal() || redis.is_io_error(), "{redis:?}");
    }
}

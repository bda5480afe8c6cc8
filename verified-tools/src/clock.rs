//! The one clock of a [`Context`](crate::Context): the wall clock of key
//! buckets and audit timestamps, and the monotonic clock the engine measures
//! and waits on (deadlines, backoff, settle points, waits for a key held
//! elsewhere).
//!
//! By default both follow tokio: `now` is tokio's `Instant::now()` (the
//! paused clock under `start_paused`, the system's outside a runtime) and a
//! wait is a tokio timer. A clock of another executor's timers (smol's
//! `async-io`, a simulation's virtual time) makes the engine run there
//! without a tokio runtime. The ledgers of stores keep to the store's own
//! clock (the contract's rule).
//!
//! A [`Deadline`](crate::Deadline) handed to a tool is an instant on this
//! clock ([`Deadline::instant`](crate::Deadline::instant)), forwarded to
//! services that read it as real time; its `remaining` and `has_passed` read
//! tokio's clock (the system's outside a runtime). A clock whose `now` is
//! real time (another executor's) agrees with them; under a virtual clock,
//! a tool compares `deadline.instant()` with that clock's `now` instead.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A source of time: "now" for key time buckets and audit timestamps
/// ([`unix_ms`](Self::unix_ms)), and the monotonic now and waits of the
/// engine ([`now`](Self::now), [`sleep_until`](Self::sleep_until)), which
/// follow tokio unless overridden. Override `now` and `sleep_until`
/// together: the engine waits with one for instants it read from the other.
///
/// ```
/// use std::future::Future;
/// use std::task::{Context, Poll, Waker};
/// use std::time::{Duration, Instant};
/// use verified_tools::{Clock, Sleep, SystemClock};
///
/// /// The wall clock, with the timers of another executor.
/// struct OtherTimers;
///
/// impl Clock for OtherTimers {
///     fn unix_ms(&self) -> u64 { SystemClock.unix_ms() }
///     fn now(&self) -> Instant { Instant::now() }
///     fn sleep_until(&self, at: Instant) -> Sleep {
///         // e.g. `Sleep::new(async_io::Timer::at(at))` under smol; here,
///         // for the example only, a wait that blocks its thread.
///         Sleep::new(async move { std::thread::sleep(at.saturating_duration_since(Instant::now())) })
///     }
/// }
///
/// // No tokio runtime here: the wait is the clock's own.
/// let clock = OtherTimers;
/// let at = clock.now() + Duration::from_millis(20);
/// let mut wait = std::pin::pin!(clock.sleep_until(at));
/// assert!(wait.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_ready());
/// assert!(Instant::now() >= at);
/// ```
pub trait Clock: Send + Sync {
    /// Milliseconds since the Unix epoch.
    fn unix_ms(&self) -> u64;

    /// The engine's monotonic now. By default, tokio's.
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    /// A wait that ends at `at` (at once if it has passed). By default, a
    /// tokio timer, which needs a tokio runtime with time enabled.
    fn sleep_until(&self, at: Instant) -> Sleep {
        Sleep::tokio(at)
    }
}

/// The system's wall clock, with tokio's monotonic clock and timers.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn unix_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    }
}

/// A clock that follows tokio's time, so paused-time tests and simulations
/// get deterministic time buckets.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin_unix_ms: u64,
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock that reads `origin_unix_ms` now and advances with tokio time.
    pub fn starting_at(origin_unix_ms: u64) -> Self {
        Self { origin_unix_ms, origin: tokio::time::Instant::now() }
    }
}

impl Clock for TokioClock {
    fn unix_ms(&self) -> u64 {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.origin_unix_ms.saturating_add(elapsed)
    }
}

pin_project_lite::pin_project! {
    /// A wait of a [`Clock`]: a tokio timer kept inline (the default
    /// clocks' way: no allocation), or any future a clock of another
    /// executor boxes.
    pub struct Sleep {
        #[pin]
        inner: Inner,
    }
}

pin_project_lite::pin_project! {
    #[project = InnerProj]
    enum Inner {
        Tokio { #[pin] timer: tokio::time::Sleep },
        Boxed { wait: Pin<Box<dyn Future<Output = ()> + Send>> },
    }
}

impl Sleep {
    /// A tokio timer that fires at `at`.
    pub fn tokio(at: Instant) -> Self {
        Self { inner: Inner::Tokio { timer: tokio::time::sleep_until(at.into()) } }
    }

    /// A wait of another executor's timers: it ends when `wait` does.
    pub fn new(wait: impl Future<Output = ()> + Send + 'static) -> Self {
        Self { inner: Inner::Boxed { wait: Box::pin(wait) } }
    }
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, task: &mut TaskContext<'_>) -> Poll<()> {
        match self.project().inner.project() {
            InnerProj::Tokio { timer } => timer.poll(task),
            InnerProj::Boxed { wait } => wait.as_mut().poll(task),
        }
    }
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.inner {
            Inner::Tokio { .. } => "Sleep(tokio)",
            Inner::Boxed { .. } => "Sleep(boxed)",
        })
    }
}

/// `future`, unless `clock` reaches `at` first (`None`). As tokio's
/// `timeout`, the future is polled first: one that is ready at once (a
/// verifier that answers from memory) never arms the timer.
pub(crate) async fn within<F: Future>(
    clock: &dyn Clock,
    at: Instant,
    future: F,
) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let first = std::future::poll_fn(|task| Poll::Ready(future.as_mut().poll(task))).await;
    if let Poll::Ready(output) = first {
        return Some(output);
    }
    let mut timer = std::pin::pin!(clock.sleep_until(at));
    std::future::poll_fn(|task| {
        if let Poll::Ready(output) = future.as_mut().poll(task) {
            return Poll::Ready(Some(output));
        }
        timer.as_mut().poll(task).map(|()| None)
    })
    .await
}

/// A wait of `d` from now on `clock`.
pub(crate) fn sleep(clock: &dyn Clock, d: Duration) -> Sleep {
    clock.sleep_until(crate::deadline::later_std(clock.now(), d))
}

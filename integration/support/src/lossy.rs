//! A lossy link for the tests: a TCP proxy on loopback that forwards to a
//! real server and loses a chosen fraction of the server's answers, as a
//! flaky network or a dying connection does, seeded so that a run can be
//! repeated.
//!
//! An answer is lost in one of two ways, each what TCP can really do:
//!
//! - **closed**: the proxy closes both sides instead of forwarding it. The
//!   server ran the command; the client sees the connection reset and
//!   reconnects (the Redis client's connection manager does so by itself).
//! - **stalled**: the proxy holds it (and what follows on that connection)
//!   for [`LossyProxy::STALL`] before forwarding it: longer than the
//!   client's answer timeout, so the client gives up on it, though the
//!   server ran the command.
//!
//! Swallowing one answer and forwarding the next is not among them: TCP
//! never does that, and a pipelining client would pair every later answer
//! with the wrong request.
//!
//! Bounded: at most [`MAX_CONNECTIONS`] connections; everything stops when
//! the proxy is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Connections one proxy accepts before it stops accepting.
pub const MAX_CONNECTIONS: u64 = 20_000;

/// What the proxy did, for the test's report.
#[derive(Debug, Default)]
pub struct Losses {
    /// Chunks of answers forwarded.
    pub forwarded: AtomicU64,
    /// Connections closed instead of forwarding an answer.
    pub closed: AtomicU64,
    /// Answers held past the client's timeout.
    pub stalled: AtomicU64,
    /// Connections accepted.
    pub connections: AtomicU64,
}

struct Dice {
    /// A splitmix64 state: one sequence of decisions per seed.
    state: AtomicU64,
    /// The chance an answer is lost, in 2^-32 units.
    loss: u64,
    /// The chance a lost answer is stalled rather than closed, likewise.
    stall: u64,
    armed: AtomicBool,
    /// A loss asked for the next chunk of answers, whatever the dice say:
    /// 0 none, 1 close, 2 stall.
    next: AtomicU8,
}

impl Dice {
    fn next(&self) -> u64 {
        let mut z = self
            .state
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) >> 32
    }

    /// What becomes of the next chunk of answers.
    fn roll(&self) -> Fate {
        match self.next.swap(0, Ordering::Relaxed) {
            1 => return Fate::Close,
            2 => return Fate::Stall,
            _ => {}
        }
        if !self.armed.load(Ordering::Relaxed) || self.next() >= self.loss {
            return Fate::Forward;
        }
        if self.next() < self.stall { Fate::Stall } else { Fate::Close }
    }
}

/// How [`LossyProxy::lose_next`] loses an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// The connection is closed instead.
    Close,
    /// It is held for [`LossyProxy::STALL`].
    Stall,
}

enum Fate {
    Forward,
    Close,
    Stall,
}

/// A lossy proxy in front of a server on loopback.
pub struct LossyProxy {
    /// The proxy's `redis://127.0.0.1:PORT/`.
    pub url: String,
    /// Its port on 127.0.0.1, for clients of other servers.
    pub port: u16,
    /// What it did so far.
    pub losses: Arc<Losses>,
    dice: Arc<Dice>,
    accept: JoinHandle<()>,
}

impl LossyProxy {
    /// How long a stalled answer is held.
    pub const STALL: Duration = Duration::from_millis(400);

    /// A proxy to `127.0.0.1:upstream` that loses a fraction `loss` of the
    /// answers once [armed](Self::arm), of which a fraction `stall` by
    /// stalling, the rest by closing the connection; decided by `seed`.
    pub async fn start(upstream: u16, loss: f64, stall: f64, seed: u64) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a loopback port");
        let port = listener.local_addr().expect("a bound address").port();
        let scale = |p: f64| (p.clamp(0.0, 1.0) * f64::from(u32::MAX)) as u64;
        let dice = Arc::new(Dice {
            state: AtomicU64::new(seed),
            loss: scale(loss),
            stall: scale(stall),
            armed: AtomicBool::new(false),
            next: AtomicU8::new(0),
        });
        let losses = Arc::new(Losses::default());
        let accept =
            tokio::spawn(accept(listener, upstream, Arc::clone(&dice), Arc::clone(&losses)));
        Self { url: format!("redis://127.0.0.1:{port}/"), port, losses, dice, accept }
    }

    /// Starts losing answers (connecting, and loading scripts, go through
    /// unharmed before).
    pub fn arm(&self) {
        self.dice.armed.store(true, Ordering::Relaxed);
    }

    /// Loses the next chunk of answers (of any connection) this way.
    pub fn lose_next(&self, how: Loss) {
        let code = match how {
            Loss::Close => 1,
            Loss::Stall => 2,
        };
        self.dice.next.store(code, Ordering::Relaxed);
    }

    /// Stops losing answers.
    pub fn disarm(&self) {
        self.dice.armed.store(false, Ordering::Relaxed);
    }

    /// What it did, in one line.
    pub fn report(&self) -> String {
        let l = &self.losses;
        format!(
            "{} connections, {} answer chunks forwarded, {} connections closed on an answer, \
             {} answers stalled",
            l.connections.load(Ordering::Relaxed),
            l.forwarded.load(Ordering::Relaxed),
            l.closed.load(Ordering::Relaxed),
            l.stalled.load(Ordering::Relaxed)
        )
    }
}

impl Drop for LossyProxy {
    fn drop(&mut self) {
        // The accept loop owns the connections' tasks: aborted with it.
        self.accept.abort();
    }
}

async fn accept(listener: TcpListener, upstream: u16, dice: Arc<Dice>, losses: Arc<Losses>) {
    let mut links = tokio::task::JoinSet::new();
    while losses.connections.load(Ordering::Relaxed) < MAX_CONNECTIONS {
        let Ok((client, _)) = listener.accept().await else { return };
        losses.connections.fetch_add(1, Ordering::Relaxed);
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
            // The server is down: the client sees the connection closed.
            continue;
        };
        links.spawn(link(client, server, Arc::clone(&dice), Arc::clone(&losses)));
        // Reap the links that ended, so the set stays small.
        while links.try_join_next().is_some() {}
    }
}

/// One client's connection: requests forwarded as they are, answers rolled
/// for.
async fn link(client: TcpStream, server: TcpStream, dice: Arc<Dice>, losses: Arc<Losses>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let requests = async {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    };
    let answers = async {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            let n = match server_read.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            match dice.roll() {
                Fate::Forward => {}
                Fate::Close => {
                    losses.closed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Fate::Stall => {
                    losses.stalled.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(LossyProxy::STALL).await;
                }
            }
            if client_write.write_all(&buffer[..n]).await.is_err() {
                return;
            }
            losses.forwarded.fetch_add(1, Ordering::Relaxed);
        }
    };
    // Either side ending ends the link: both sockets are dropped, closed.
    tokio::select! {
        () = requests => {}
        () = answers => {}
    }
}

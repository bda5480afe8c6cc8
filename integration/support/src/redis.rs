//! Real Redis servers for the tests: the run's shared one (`VT_REDIS_URL`,
//! exported by `.ci/run`), or a private `redis-server` this process starts
//! on a free loopback port (and may stop and restart, to test an outage).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOW: &str = "install it with `apt-get install redis-server`, or run `.ci/run`, \
                   which starts one and exports VT_REDIS_URL";

/// A Redis server for one test.
#[derive(Debug)]
pub struct RedisServer {
    /// `redis://127.0.0.1:PORT/`.
    pub url: String,
    port: u16,
    /// Set for a private server: the process, and its data directory.
    child: Option<Child>,
    dir: Option<PathBuf>,
    /// The options of a private server, after its port and directory.
    options: Vec<String>,
}

/// A private server's persistence: AOF, every write fsynced (what the
/// ledger's docs ask for).
const DURABLE: [&str; 6] = ["--appendonly", "yes", "--appendfsync", "always", "--save", ""];

/// How long a (re)started server has to answer `PING` with `PONG`: generous,
/// for a loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(30);

impl RedisServer {
    /// The run's shared server, else a private one; `None` (after saying
    /// what is missing) when neither exists.
    pub fn shared() -> Option<Self> {
        if let Ok(url) = std::env::var("VT_REDIS_URL") {
            return Some(Self { url, port: 0, child: None, dir: None, options: Vec::new() });
        }
        Self::private()
    }

    /// A private server, started now, that the test may stop and restart.
    /// It persists with AOF (`appendfsync always`), as the ledger's docs ask.
    pub fn private() -> Option<Self> {
        Self::private_with(&DURABLE)
    }

    /// A private server with these options (persistence, delays) instead of
    /// [`DURABLE`]'s.
    pub fn private_with(options: &[&str]) -> Option<Self> {
        let Some(binary) = redis_server() else {
            super::missing("redis-server", HOW);
            return None;
        };
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("vt-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let mut server = Self {
            url: format!("redis://127.0.0.1:{port}/"),
            port,
            child: None,
            dir: Some(dir),
            options: options.iter().map(|&o| o.to_owned()).collect(),
        };
        server.child = Some(server.spawn(&binary));
        server.wait_ready();
        Some(server)
    }

    /// The server's loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops a private server (SIGKILL: an outage, not a clean shutdown).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a stopped private server again on the same port and data, and
    /// waits until it serves (its AOF loaded).
    pub fn restart(&mut self) {
        self.restart_with(&[]);
        self.wait_ready();
    }

    /// Starts a stopped private server again, with `extra` options, and
    /// returns at once: it may refuse connections or answer `LOADING` for a
    /// while, as a restarting server does.
    pub fn restart_with(&mut self, extra: &[&str]) {
        assert!(self.dir.is_some(), "only a private server can be restarted");
        if self.child.is_none() {
            let binary = redis_server().expect("redis-server was found at start");
            let saved = self.options.clone();
            self.options.extend(extra.iter().map(|&o| o.to_owned()));
            self.child = Some(self.spawn(&binary));
            self.options = saved;
        }
    }

    fn spawn(&self, binary: &PathBuf) -> Child {
        let dir = self.dir.as_ref().expect("a private server has a directory");
        Command::new(binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(dir)
            .args(&self.options)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts")
    }

    /// Waits until the server answers `PING` with `PONG`: listening is not
    /// serving (a restarted server answers `-LOADING` while it reads its AOF).
    pub fn wait_ready(&self) {
        let started = Instant::now();
        let mut last = String::from("no connection");
        while started.elapsed() < READY_WITHIN {
            match ping(self.port) {
                Ok(answer) if answer.starts_with("+PONG") => return,
                Ok(answer) => last = answer,
                Err(error) => last = error.to_string(),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not serve within {READY_WITHIN:?}: {last}", self.port);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `redis-server` on the PATH (or `VT_REDIS_SERVER`).
fn redis_server() -> Option<PathBuf> {
    if let Ok(path) = std::env::var("VT_REDIS_SERVER") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join("redis-server")).find(|p| p.is_file())
}

impl RedisServer {
    /// Runs one command, written inline (`SET a 1`, quotes allowed), on a
    /// fresh connection: the answer's first line, and a bulk string's text
    /// after it. For setting a server up, not for the code under test.
    pub fn command(&self, line: &str) -> String {
        self.try_command(line).unwrap_or_else(|e| panic!("redis `{line}`: {e}"))
    }

    /// [`command`](Self::command), for a server that may not be listening.
    pub fn try_command(&self, line: &str) -> std::io::Result<String> {
        command(self.port, line)
    }

    /// Writes `keys` filler keys and rewrites the AOF, so that they are in
    /// its RDB base: a restart with `--key-load-delay N` (µs per key) then
    /// answers `LOADING` for about `keys × N` µs, as a server with a large
    /// data set does.
    pub fn fill(&self, keys: u32) {
        let script = format!(
            "EVAL \"for i = 1, {keys} do redis.call('SET', 'vt-fill:' .. i, 'x') end return 1\" 0"
        );
        assert_eq!(self.command(&script).trim(), ":1");
        self.command("BGREWRITEAOF");
        let started = Instant::now();
        loop {
            let info = self.command("INFO persistence");
            if info.contains("aof_rewrite_in_progress:0")
                && info.contains("aof_rewrite_scheduled:0")
            {
                return;
            }
            assert!(started.elapsed() < READY_WITHIN, "the AOF rewrite did not end: {info}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One `PING` on a fresh connection: the first line of the answer.
fn ping(port: u16) -> std::io::Result<String> {
    command(port, "PING")
}

fn command(port: u16, line: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(format!("{line}\r\n").as_bytes())?;
    let read_line = |stream: &mut TcpStream| -> std::io::Result<String> {
        let mut answer = Vec::new();
        let mut byte = [0u8];
        while !answer.ends_with(b"\r\n") && answer.len() < 512 {
            if stream.read(&mut byte)? == 0 {
                break;
            }
            answer.push(byte[0]);
        }
        Ok(String::from_utf8_lossy(&answer).into_owned())
    };
    let first = read_line(&mut stream)?;
    let Some(len) = first.strip_prefix('$').and_then(|n| n.trim().parse::<usize>().ok()) else {
        return Ok(first);
    };
    let mut bulk = vec![0u8; len + 2];
    stream.read_exact(&mut bulk)?;
    Ok(format!("{first}{}", String::from_utf8_lossy(&bulk)))
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("a bound address").port()
}

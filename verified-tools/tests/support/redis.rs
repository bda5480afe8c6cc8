//! Real Redis servers for the tests: the run's shared one (`VT_REDIS_URL`,
//! exported by `.ci/run`), or a private `redis-server` this process starts
//! on a free loopback port (and may stop and restart, to test an outage).

use std::net::TcpListener;
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
}

impl RedisServer {
    /// The run's shared server, else a private one; `None` (after saying
    /// what is missing) when neither exists.
    pub fn shared() -> Option<Self> {
        if let Ok(url) = std::env::var("VT_REDIS_URL") {
            return Some(Self { url, port: 0, child: None, dir: None });
        }
        Self::private()
    }

    /// A private server, started now, that the test may stop and restart.
    /// It persists with AOF (`appendfsync always`), as the ledger's docs ask.
    pub fn private() -> Option<Self> {
        let Some(binary) = redis_server() else {
            super::missing("redis-server", HOW);
            return None;
        };
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("vt-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let mut server =
            Self { url: format!("redis://127.0.0.1:{port}/"), port, child: None, dir: Some(dir) };
        server.child = Some(server.spawn(&binary));
        server.wait_ready();
        Some(server)
    }

    /// Stops a private server (SIGKILL: an outage, not a clean shutdown).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a stopped private server again on the same port and data.
    pub fn restart(&mut self) {
        assert!(self.dir.is_some(), "only a private server can be restarted");
        if self.child.is_none() {
            let binary = redis_server().expect("redis-server was found at start");
            self.child = Some(self.spawn(&binary));
            self.wait_ready();
        }
    }

    fn spawn(&self, binary: &PathBuf) -> Child {
        let dir = self.dir.as_ref().expect("a private server has a directory");
        Command::new(binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--appendonly", "yes", "--appendfsync", "always", "--save", ""])
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts")
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
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

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("a bound address").port()
}

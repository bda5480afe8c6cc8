//! A real PostgreSQL server for the tests: the run's throwaway one, started
//! by `.ci/postgres.sh` (which `.ci/run` sources) and named by
//! `VT_POSTGRES_URL`, or any server that variable points at; or a private
//! one a test starts, stops and starts again ([`PostgresServer`]).

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

// ------------------------------------------------------- a private server

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const BINARIES: &str = "PostgreSQL's server binaries (initdb, pg_ctl, pg_isready)";
const INSTALL: &str = "install them with `apt-get install postgresql` (or run \
                       `bash .ci/postgres.sh` once, which does), or put initdb and pg_ctl \
                       on the PATH";

/// How long a (re)started server has to accept connections: generous, for
/// a loaded machine (a restart after `-m immediate` recovers from its WAL
/// first).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A PostgreSQL server of one test's own: a cluster `initdb` makes in a
/// temporary directory, on a free loopback port, that the test may stop
/// and start again (an outage, a crash). The binaries are the ones
/// `.ci/postgres.sh` finds (`initdb` and `pg_ctl` on the PATH, else the
/// newest `/usr/lib/postgresql/*/bin`); as root, the server runs as the
/// `postgres` user (made if missing), as the server refuses root. Stopped
/// (`-m immediate`) and removed when dropped.
#[derive(Debug)]
pub struct PostgresServer {
    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub url: String,
    port: u16,
    /// The temporary directory: the cluster in `data/`, the server's log.
    dir: PathBuf,
    bin: PathBuf,
    pg_isready: PathBuf,
    /// `runuser -u postgres --`, as root.
    run_as: Vec<String>,
    running: bool,
}

impl PostgresServer {
    /// A private server, started and accepting connections; `None` (after
    /// [`super::missing`]) when the binaries are absent.
    pub fn private() -> Option<Self> {
        let Some((bin, pg_isready)) = binaries() else {
            super::missing(BINARIES, INSTALL);
            return None;
        };
        let root = run(Command::new("id").arg("-u")).is_ok_and(|out| out.trim() == "0");
        let mut run_as = Vec::new();
        if root {
            let mut id = Command::new("id");
            id.arg("postgres").stdout(Stdio::null()).stderr(Stdio::null());
            if !id.status().is_ok_and(|status| status.success()) {
                let mut useradd = Command::new("useradd");
                useradd.args(["--system", "--home-dir", "/nonexistent"]);
                useradd.args(["--shell", "/usr/sbin/nologin", "postgres"]);
                run(&mut useradd).unwrap_or_else(|e| panic!("useradd postgres: {e}"));
            }
            run_as = ["runuser", "-u", "postgres", "--"].map(String::from).to_vec();
        }
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("vt-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory for the cluster");
        if root {
            run(Command::new("chown").arg("postgres:").arg(&dir)).expect("chown to postgres");
        }
        let mut server = Self {
            url: format!("postgres://postgres@127.0.0.1:{port}/postgres"),
            port,
            dir,
            bin,
            pg_isready,
            run_as,
            running: false,
        };
        // Trust on loopback (a throwaway server); no fsync at initdb.
        let mut initdb = server.command("initdb");
        initdb.arg("-D").arg(server.data());
        initdb.args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"]);
        run(&mut initdb).unwrap_or_else(|e| panic!("initdb: {e}"));
        server.start();
        Some(server)
    }

    /// The server's loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A server binary, run as the server's user.
    fn command(&self, binary: &str) -> Command {
        let path = self.bin.join(binary);
        match self.run_as.split_first() {
            Some((runuser, args)) => {
                let mut command = Command::new(runuser);
                command.args(args).arg(path);
                command
            }
            None => Command::new(path),
        }
    }

    /// Starts the (stopped) server on its port and data, and waits until it
    /// accepts connections (after `-m immediate`, its recovery done).
    ///
    /// `fsync=off`: no write is forced to the disk, but every commit is
    /// written to the WAL (in the page cache) before it returns, which is
    /// what a stop of the server, even `-m immediate`, can lose nothing of:
    /// only the machine's crash could. `synchronous_commit` is the default,
    /// `on`, as the ledger's docs ask.
    pub fn start(&mut self) {
        assert!(!self.running, "the server is running");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=60",
            self.port,
            self.dir.display()
        );
        let mut pg_ctl = self.command("pg_ctl");
        pg_ctl.arg("-D").arg(self.data()).arg("-l").arg(self.dir.join("server.log"));
        pg_ctl.args(["-w", "-t", "120", "-o", &options, "start"]);
        if let Err(e) = run(&mut pg_ctl) {
            panic!("pg_ctl start: {e}\n{}", self.log());
        }
        self.running = true;
        self.wait_ready();
    }

    /// Stops the server: `mode` is `pg_ctl`'s (`fast`: sessions ended, a
    /// checkpoint; `immediate`: every process killed at once, a crash as
    /// far as the data is concerned). Returns when it is down.
    pub fn stop(&mut self, mode: &str) {
        if !self.running {
            return;
        }
        let mut pg_ctl = self.command("pg_ctl");
        pg_ctl.arg("-D").arg(self.data()).args(["-m", mode, "-w", "-t", "120", "stop"]);
        if let Err(e) = run(&mut pg_ctl) {
            panic!("pg_ctl stop -m {mode}: {e}\n{}", self.log());
        }
        self.running = false;
    }

    /// Waits until the server accepts connections (`pg_isready`, polled):
    /// listening is not serving (a starting server refuses sessions).
    pub fn wait_ready(&self) {
        let started = Instant::now();
        let port = self.port.to_string();
        loop {
            let mut probe = Command::new(&self.pg_isready);
            probe.args(["-q", "-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-t", "5"]);
            if probe.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
            {
                return;
            }
            assert!(
                started.elapsed() < READY_WITHIN,
                "postgres on port {port} did not accept connections within {READY_WITHIN:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's log, for a failure's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.running {
            let mut pg_ctl = self.command("pg_ctl");
            pg_ctl.arg("-D").arg(self.data()).args(["-m", "immediate", "-w", "stop"]);
            let _ = run(&mut pg_ctl);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The server's binaries and `pg_isready`, found as `.ci/postgres.sh`
/// finds them; `pg_isready` beside `initdb` (through its symlink, if it is
/// one) or on the PATH.
fn binaries() -> Option<(PathBuf, PathBuf)> {
    let on_path = |name: &str| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
    };
    let bin = match (on_path("initdb"), on_path("pg_ctl")) {
        (Some(initdb), Some(_)) => initdb.parent()?.to_path_buf(),
        _ => {
            let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
                .ok()?
                .filter_map(|entry| {
                    let entry = entry.ok()?;
                    let version = entry.file_name().to_str()?.parse().ok()?;
                    Some((version, entry.path().join("bin")))
                })
                .filter(|(_, bin)| bin.join("initdb").is_file())
                .collect();
            versions.sort();
            versions.pop()?.1
        }
    };
    let beside = |dir: &Path| Some(dir.join("pg_isready")).filter(|p| p.is_file());
    let real = std::fs::canonicalize(bin.join("initdb")).ok();
    let pg_isready = beside(&bin)
        .or_else(|| real.as_deref().and_then(Path::parent).and_then(beside))
        .or_else(|| on_path("pg_isready"))?;
    Some((bin, pg_isready))
}

/// Runs a command to its end: its stdout, or what it said when it failed.
fn run(command: &mut Command) -> Result<String, String> {
    let Output { status, stdout, stderr } =
        command.stdin(Stdio::null()).output().map_err(|e| format!("{command:?}: {e}"))?;
    if status.success() {
        return Ok(String::from_utf8_lossy(&stdout).into_owned());
    }
    Err(format!(
        "{command:?}: {status}\n{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    ))
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    listener.local_addr().expect("a bound address").port()
}

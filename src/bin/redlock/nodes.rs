//! How to reach the nodes: the options every subcommand but `demo` shares (members, timeouts,
//! the restart guard, TLS files, the key prefix and compat mode) and the client built from them.

#[cfg(feature = "tls")]
use std::path::Path;
#[cfg(feature = "tls")]
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use quorumlock::{Error, Redlock, RestartGuard};

use crate::{EXIT_USAGE, MAX_NODE_TIMEOUT, MAX_TTL, MAX_TTL_TEXT, duration_up_to, fail, report};

/// How to reach the nodes (every subcommand but `demo`).
#[derive(Debug, Args)]
pub(crate) struct NodeArgs {
    /// The Redis masters (`redis://`, `rediss://` or `unix://` URLs; see the help text).
    #[arg(
        help = "The quorum members: redis://[user:pass@]host:port[/db], rediss://..., unix:///path.sock, redis+cluster://h1:p1,h2:p2 (a Redis Cluster), redis+sentinel://h1:p1,h2:p2/name (a Sentinel-managed primary)",
        long,
        global = true,
        env = "REDLOCK_NODES",
        value_delimiter = ',',
        value_name = "URL[,URL...]",
        hide_env_values = true
    )]
    nodes: Vec<String>,

    /// How long one node may take to answer one call.
    #[arg(long, global = true, env = "REDLOCK_NODE_TIMEOUT", hide_env_values = true, value_name = "D",
          default_value = "250ms", value_parser = duration_up_to(MAX_NODE_TIMEOUT, "1h"))]
    pub(crate) node_timeout: Duration,

    /// Which nodes are kept out of quorums because they may have restarted without their lock
    /// keys: `strict` (default) holds out every node whose uptime is below the max ttl.
    #[arg(
        long,
        global = true,
        env = "REDLOCK_RESTART_GUARD",
        hide_env_values = true,
        value_name = "GUARD",
        default_value = "strict"
    )]
    restart_guard: Guard,

    /// The largest ttl any client uses on these nodes (default: this run's --ttl); a node up
    /// for less than this is held out under the strict guard.
    #[arg(long, global = true, env = "REDLOCK_MAX_TTL", hide_env_values = true, value_name = "D",
          value_parser = duration_up_to(MAX_TTL, MAX_TTL_TEXT))]
    max_ttl: Option<Duration>,

    /// Trust this CA certificate (PEM file) for rediss:// nodes, in place of the system's roots.
    #[cfg(feature = "tls")]
    #[arg(long, global = true, env = "REDLOCK_TLS_CA", value_name = "FILE")]
    tls_ca: Option<PathBuf>,

    /// Present this client certificate (PEM file) to rediss:// nodes (mutual TLS); needs
    /// --tls-key.
    #[cfg(feature = "tls")]
    #[arg(
        long,
        global = true,
        env = "REDLOCK_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,

    /// The private key (PEM file) of --tls-cert; needs --tls-cert.
    #[cfg(feature = "tls")]
    #[arg(
        long,
        global = true,
        env = "REDLOCK_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,

    /// The prefix of every key written (the lock on KEY is PREFIX:{KEY}); every client of a
    /// lock must use the same one. Default: quorumlock.
    #[arg(
        long,
        global = true,
        env = "REDLOCK_KEY_PREFIX",
        hide_env_values = true,
        value_name = "P"
    )]
    key_prefix: Option<String>,

    /// Lock the plain KEY the way other Redlock clients do (redsync, node-redlock, pottery,
    /// rslock), so that they and redlock exclude each other; no fencing tokens (REDLOCK_TOKEN
    /// is 0), `run` only.
    #[arg(long, global = true, env = "REDLOCK_COMPAT",
          action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    compat: bool,

    /// The owner name stored with the locks this process takes, shown by `redlock status` and
    /// an election's leader (default for run and elect: HOST/pid PID; "" for none).
    #[arg(
        long,
        global = true,
        env = "REDLOCK_OWNER",
        hide_env_values = true,
        value_name = "NAME"
    )]
    owner: Option<String>,
}

/// The `--restart-guard` values (see `quorumlock::RestartGuard`).
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Guard {
    /// Trust every node.
    Off,
    /// Hold out a node only after seeing its run id change (never happens in one short run).
    Restarted,
    /// Also hold out nodes whose uptime is below the max ttl when first contacted.
    Strict,
}

/// The node URLs from `--nodes` pieces split at commas: a piece without `://` continues the
/// member URL before it (`redis+cluster://h1:p1,h2:p2` lists its seeds with commas). Empty
/// pieces (a trailing comma) are ignored.
pub(crate) fn member_urls(pieces: &[String]) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    for piece in pieces.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        match urls.last_mut() {
            Some(last)
                if !piece.contains("://")
                    && (last.starts_with("redis+cluster://")
                        || last.starts_with("redis+sentinel://")) =>
            {
                last.push(',');
                last.push_str(piece);
            }
            _ => urls.push(piece.to_owned()),
        }
    }
    urls
}

/// Builds the client from the node options.
///
/// The max ttl (how long a fresh node is held out) is `--max-ttl`, raised to this run's `ttl`.
/// It is fixed here rather than learnt from the first acquisition because the strict guard
/// judges each node when it first connects.
pub(crate) fn client(args: &NodeArgs, ttl: Option<Duration>) -> Result<Redlock, Setup> {
    let urls = member_urls(&args.nodes);
    #[cfg(feature = "tls")]
    let over_tls = urls
        .iter()
        .any(|u| u.starts_with("rediss") || u.starts_with("valkeys"));
    let guard = match args.restart_guard {
        Guard::Off => RestartGuard::Off,
        Guard::Restarted => RestartGuard::Restarted,
        Guard::Strict => RestartGuard::Strict,
    };
    if args.compat && args.key_prefix.is_some() {
        // Not a clap conflict: that would count REDLOCK_COMPAT=false as given.
        return Err(Setup::Usage(
            "--compat locks the plain KEY: it takes no --key-prefix (REDLOCK_KEY_PREFIX)",
        ));
    }
    let mut builder = Redlock::builder(urls)
        .node_timeout(args.node_timeout)
        .restart_guard(guard)
        .compat(args.compat);
    if let Some(prefix) = &args.key_prefix {
        builder = builder.key_prefix(prefix);
    }
    // Only `run` and `elect` take locks (they pass their ttl): they name themselves by default.
    match args.owner.as_deref() {
        Some("") => {}
        Some(owner) => builder = builder.owner(owner),
        None if ttl.is_some() => builder = builder.owner(default_owner()),
        None => {}
    }
    // Certificates are read only for nodes that use them.
    #[cfg(feature = "tls")]
    if over_tls {
        if let Some(ca) = &args.tls_ca {
            builder = builder.tls_root_certificate(read("--tls-ca", ca)?);
        }
        if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
            builder =
                builder.tls_client_certificate(read("--tls-cert", cert)?, read("--tls-key", key)?);
        }
    }
    if let Some(max_ttl) = args.max_ttl.max(ttl) {
        builder = builder.max_ttl(max_ttl);
    }
    Ok(builder.build()?)
}

/// The owner name of a lock taken without `--owner`: `HOST/pid PID`, as `ps` would find it.
pub(crate) fn default_owner() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".to_owned());
    format!("{host}/pid {}", std::process::id())
}

/// Why no client could be built from the options.
#[derive(Debug)]
pub(crate) enum Setup {
    /// The library refused the configuration (a bad URL, prefix, certificate...).
    Library(Error),
    /// Options that do not go together.
    Usage(&'static str),
    /// A file named by an option could not be read.
    #[cfg(feature = "tls")]
    File {
        flag: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
}

impl From<Error> for Setup {
    fn from(e: Error) -> Self {
        Setup::Library(e)
    }
}

impl From<quorumlock::ConfigError> for Setup {
    fn from(e: quorumlock::ConfigError) -> Self {
        Setup::Library(e.into())
    }
}

impl Setup {
    /// Reports the failure on one line and returns its exit code (64 for a file that cannot be
    /// read: a usage error, as a bad URL is).
    pub(crate) fn fail(&self) -> u8 {
        match self {
            Setup::Library(e) => fail(e),
            Setup::Usage(why) => {
                report(why);
                EXIT_USAGE
            }
            #[cfg(feature = "tls")]
            Setup::File { flag, path, cause } => {
                report(&format_args!(
                    "cannot read {flag} {}: {cause}",
                    path.display()
                ));
                EXIT_USAGE
            }
        }
    }
}

/// The most a `--tls-*` file may hold: a bundle of certificates is kilobytes.
#[cfg(feature = "tls")]
const MAX_TLS_FILE: u64 = 1 << 20;

/// The contents of a file named by `flag`: at most [`MAX_TLS_FILE`] bytes (an endless file
/// such as `/dev/zero` is refused once past it), and opened without waiting for a writer (a
/// FIFO nobody writes to reads as empty). An empty file is refused too.
#[cfg(feature = "tls")]
fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, Setup> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    use nix::fcntl::{FcntlArg, OFlag, fcntl};

    let fail = |cause: std::io::Error| Setup::File {
        flag,
        path: path.to_owned(),
        cause,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(fail)?;
    // Reads block again (a pipe's writer may still be writing), but the open did not wait.
    fcntl(&file, FcntlArg::F_SETFL(OFlag::empty())).map_err(|e| fail(e.into()))?;
    let mut bytes = Vec::new();
    file.take(MAX_TLS_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(fail)?;
    let invalid = |why: &str| fail(std::io::Error::new(std::io::ErrorKind::InvalidData, why));
    if bytes.len() as u64 > MAX_TLS_FILE {
        return Err(invalid(
            "it is larger than 1 MiB, which no certificate bundle is",
        ));
    }
    if bytes.is_empty() {
        return Err(invalid("it is empty"));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn comma_lists_inside_member_urls_stay_whole() {
        let pieces: Vec<String> = [
            "redis://a:1",
            "redis+cluster://h1:1",
            "h2:2",
            "h3:3",
            "redis+sentinel://s1:1",
            "s2:2/mymaster",
            "unix:///tmp/r.sock",
            "",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(
            member_urls(&pieces),
            [
                "redis://a:1",
                "redis+cluster://h1:1,h2:2,h3:3",
                "redis+sentinel://s1:1,s2:2/mymaster",
                "unix:///tmp/r.sock"
            ]
        );
        // A piece without a scheme after a single-server URL stays its own (and fails to parse).
        let pieces = ["redis://a:1", "b:2"].map(str::to_owned).to_vec();
        assert_eq!(member_urls(&pieces), ["redis://a:1", "b:2"]);
    }
}

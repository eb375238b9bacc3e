//! `redlock`: a distributed `flock(1)`. Runs a command while holding a Redlock lock across N
//! independent Redis masters. The contract (options, environment, exit codes) is in
//! `docs/cli.md`; this file parses arguments and owns the mapping from errors to exit codes.

/// `println!` that treats a closed stdout (`redlock demo | head`) as nothing to do, not a panic.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

mod check;
mod child;
mod demo;
mod elect;
mod ls;
mod nodes;
mod once;
mod run;
mod status;

use std::ffi::OsString;
use std::fmt::Display;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use quorumlock::{ConfigError, Error, RedlockBuilder, Semaphore};

use crate::child::CmdOptions;
use crate::nodes::{NodeArgs, client};

// When CMD ran to its end while the lock was held, `redlock` exits with CMD's own code.

/// Usage error: bad flag, bad duration, bad node URL, no nodes given.
const EXIT_USAGE: u8 = 64;
/// Compat mode: KEY is an existing key of another type (an application's hash, list...),
/// which no lock can ever take (EX_DATAERR).
const EXIT_WRONG_TYPE: u8 = 65;
/// Too few nodes reachable for a quorum (after the retries).
const EXIT_NO_QUORUM: u8 = 69;
/// The lock is held by another owner (after `--wait`); `-E CODE` chooses another.
const EXIT_HELD: u8 = 75;
/// The lock was lost while CMD ran; CMD was terminated.
const EXIT_LOST: u8 = 79;
/// Outside the contract: a library error this build does not know how to classify (EX_SOFTWARE).
/// The library's error enum is `#[non_exhaustive]`; a new variant lands here until it is mapped.
const EXIT_SOFTWARE: u8 = 70;
/// The nodes' ACL refuses a command the crate needs on enough nodes to rule out a quorum
/// (`EX_NOPERM`); the line names the command.
const EXIT_NOPERM: u8 = 77;

/// Run a command while holding a distributed lock across N independent Redis masters
/// (Redlock): a distributed flock(1).
#[derive(Debug, Parser)]
#[command(name = "redlock", version, propagate_version = true)]
#[command(
    after_help = "Exit codes: CMD's own (128+signal if it died of a signal), \
    64 usage error, 65 (--compat) KEY is an existing key of another type, \
    69 too few nodes reachable for a quorum, 75 held by another owner \
    (or another candidate leads, after elect --wait; -E CODE chooses another code), \
    77 the nodes' ACL refuses a command redlock needs (the line names it), \
    79 lock or leadership lost while CMD ran; run --once-per: 0 when another host runs or ran \
    CMD this period (-E CODE chooses another); status: 0 when a quorum answered; \
    check: 0 the token is current, 1 it is not; break: 0 revoked, 1 nothing held; \
    ls: 0 when a quorum was scanned; \
    outside the contract: 126/127 CMD cannot be run / not found, 128+signal interrupted \
    before CMD started, 70 unclassified internal error, 71 operating system error. \
    See docs/cli.md."
)]
struct Cli {
    #[command(flatten)]
    nodes: NodeArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Acquire KEY, run CMD while extending the lock, release it when CMD exits.
    #[command(override_usage = "redlock run [OPTIONS] KEY -- CMD [ARGS...]")]
    #[command(
        after_help = "Exit codes: CMD's own when it ran to its end under the lock; \
        64 usage error; 65 (--compat) KEY is an existing key of another type; 69 too few \
        nodes for a quorum; 75 (or -E CODE) held by another owner \
        after --wait; 77 the nodes' ACL refuses a command; 79 the lock was lost while CMD ran (CMD was terminated); 126/127 CMD \
        cannot be run / not found. With --once-per: CMD's own when this host ran it; 0 (or \
        -E CODE) when another host runs or ran it this period; 69, 79, 126/127 as above."
    )]
    Run(RunArgs),
    /// Campaign for leadership of NAME; run CMD while this process leads, stop it when
    /// leadership is lost, resign when CMD exits.
    #[command(override_usage = "redlock elect [OPTIONS] NAME -- CMD [ARGS...]")]
    #[command(
        after_help = "Exit codes: CMD's own when it ran to its end while leading; \
        64 usage error; 75 (or -E CODE) another candidate still leads after --wait; 69 too \
        few nodes for a quorum after --wait; 77 the nodes' ACL refuses a command; 79 leadership was lost while CMD ran (CMD was \
        terminated); 126/127 CMD cannot be run / not found; 128+signal interrupted while \
        campaigning (nothing was run)."
    )]
    Elect(ElectArgs),
    /// Show, per node, who holds KEY, for how long, and the node's fencing counter.
    #[command(
        after_help = "Exit codes: 0 when a quorum of nodes answered (whoever holds KEY), \
        69 otherwise (the table or JSON is printed either way), 77 the nodes' ACL refuses \
        the read, 64 usage error."
    )]
    Status(StatusArgs),
    /// Check a fencing token: whether KEY is held on a quorum and TOKEN is its highest
    /// fencing counter (the current holder's token).
    #[command(
        after_help = "Exit codes: 0 TOKEN is current, 1 it is not (superseded by a later \
        holder or a break, not held, or never handed out), 69 too few nodes answered, 77 the \
        nodes' ACL refuses the read, 64 usage error (also with --compat: no tokens)."
    )]
    Check(CheckArgs),
    /// Revoke KEY's holder: raise its fencing counter past the holder's token on a quorum,
    /// then delete the holder's value. The old holder's token is refused from then on by
    /// resources that check it, its next extension fails, and waiters take over.
    #[command(
        after_help = "Exit codes: 0 a holder was revoked, 1 nobody held KEY (or --value V held \
        it nowhere): nothing done, 69 too few nodes answered (where the break ran, the counter \
        is raised and the value deleted: run it again), 77 the nodes' ACL refuses the revoke, \
        64 usage error (also with --compat: no tokens)."
    )]
    Break(BreakArgs),
    /// List every lock held under PREFIX (all when omitted): key, holder, on how many nodes,
    /// age, time left on a quorum, fencing counter.
    #[command(
        after_help = "Exit codes: 0 when a quorum of nodes was scanned (those that were not \
        are named on stderr) and, with --older-than, some lock is older; 1 with --older-than \
        when no lock is (the table is empty); 69 too few nodes scanned, 77 the nodes' ACL \
        refuses the scan, 64 usage error (also with --compat)."
    )]
    Ls(LsArgs),
    /// Start 5 throwaway local redis-servers and watch workers hand a lock over.
    Demo(demo::DemoArgs),
}

/// `redlock run [OPTIONS] KEY -- CMD [ARGS...]`
#[derive(Debug, Args)]
struct RunArgs {
    /// The lease: how long the lock lives unless extended (extended every ttl/3 while CMD runs).
    #[arg(long, value_name = "D", default_value = "30s", value_parser = duration_up_to(MAX_TTL, MAX_TTL_TEXT))]
    ttl: Duration,
    /// How long to wait while another owner holds the lock. Default 0s: one try, with a few
    /// short randomized retries, then exit 75. Unlike flock(1), which waits for ever unless -n,
    /// redlock waits only when asked: -w 30 (or 30s, 5m) waits up to 30 seconds.
    #[arg(short = 'w', long, value_name = "D", default_value = "0s", value_parser = duration_up_to(MAX_WAIT, "365days"))]
    wait: Duration,
    /// After the lock is lost, how long CMD (its process group) has between SIGTERM and SIGKILL.
    #[arg(long, value_name = "D", default_value = "5s",
          value_parser = duration_up_to(MAX_KILL_AFTER, "1day"))]
    kill_after: Duration,
    /// Keep CMD in redlock's process group, as timeout(1) --foreground does: CMD can read from
    /// the terminal and gets the terminal's signals, but only CMD itself (not what it started)
    /// is signalled. By default CMD runs in a process group of its own, and signals (forwarded,
    /// or SIGTERM/SIGKILL after a loss) go to that whole group.
    #[arg(long)]
    foreground: bool,
    /// The exit code when another owner holds the lock (after --wait), as flock -E: default 75,
    /// or 0 with --once-per (another host runs or ran CMD this period).
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "CODE")]
    conflict_exit_code: Option<u8>,
    /// Run CMD on one host only per period of this length (ticks counted from the Unix epoch:
    /// 1h runs at most once each clock hour), however many hosts run this command; the others
    /// exit 0 (or -E CODE) without running it. At least 1s. Not with --wait.
    #[arg(long, value_name = "PERIOD", conflicts_with = "wait",
          value_parser = period_parser())]
    once_per: Option<Duration>,
    /// Treat KEY as a semaphore of N permits: run CMD when one of the N is free (at most N
    /// CMDs at once across hosts), under that permit's lock; N is 1 to 1000. Not with
    /// --once-per. (Not flock's -n: redlock never waits unless -w/--wait is given.)
    #[arg(short = 'n', long = "permits", value_name = "N", conflicts_with = "once_per",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(Semaphore::MAX_PERMITS)))]
    permits: Option<u32>,
    /// The lock's name.
    key: String,
    /// The command to run (directly, no shell) and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    cmd: Vec<OsString>,
}

impl RunArgs {
    /// The exit code for a lock held by another owner (`-E`, or the default).
    fn conflict_code(&self) -> u8 {
        let default = if self.once_per.is_some() {
            0
        } else {
            EXIT_HELD
        };
        self.conflict_exit_code.unwrap_or(default)
    }

    fn cmd_options(&self) -> CmdOptions<'_> {
        CmdOptions {
            argv: &self.cmd,
            foreground: self.foreground,
        }
    }
}

/// `redlock elect [OPTIONS] NAME -- CMD [ARGS...]`
#[derive(Debug, Args)]
struct ElectArgs {
    /// The lease of a term: extended every ttl/3 while this process leads; a crashed leader
    /// blocks the election for about this long.
    #[arg(long, value_name = "D", default_value = "10s", value_parser = duration_up_to(MAX_TTL, MAX_TTL_TEXT))]
    ttl: Duration,
    /// Campaign for at most this long, then exit 75 (or -E CODE) if another candidate still
    /// leads (-w 30, or 30s, 5m). Default: campaign until elected.
    #[arg(short = 'w', long, value_name = "D", value_parser = duration_up_to(MAX_WAIT, "365days"))]
    wait: Option<Duration>,
    /// The exit code when another candidate still leads after --wait (default 75).
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "CODE")]
    conflict_exit_code: Option<u8>,
    /// This candidate's id, published while it leads (default: $HOSTNAME-PID-RANDOM).
    #[arg(long, value_name = "ID")]
    candidate: Option<String>,
    /// After leadership is lost, how long CMD (its process group) has between SIGTERM and
    /// SIGKILL.
    #[arg(long, value_name = "D", default_value = "5s",
          value_parser = duration_up_to(MAX_KILL_AFTER, "1day"))]
    kill_after: Duration,
    /// Keep CMD in redlock's process group and signal CMD alone (as for `run`).
    #[arg(long)]
    foreground: bool,
    /// The election's name (its lock's key).
    name: String,
    /// The command to run while leading (directly, no shell) and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    cmd: Vec<OsString>,
}

impl ElectArgs {
    fn cmd_options(&self) -> CmdOptions<'_> {
        CmdOptions {
            argv: &self.cmd,
            foreground: self.foreground,
        }
    }
}

/// `redlock status [--json] KEY`
#[derive(Debug, Args)]
struct StatusArgs {
    /// Print one JSON object (schema in docs/cli.md) instead of the table.
    #[arg(long)]
    json: bool,
    /// The lock's name.
    key: String,
}

/// `redlock check KEY TOKEN`
#[derive(Debug, Args)]
struct CheckArgs {
    /// The lock's name.
    key: String,
    /// The fencing token to check (a holder's `REDLOCK_TOKEN`).
    token: u64,
}

/// `redlock ls [PREFIX] [--older-than D] [--json]`
#[derive(Debug, Args)]
struct LsArgs {
    /// Print one JSON object (schema in docs/cli.md) instead of the table.
    #[arg(long)]
    json: bool,
    /// List only the locks acquired more than D ago (by the acquiring host's clock; e.g. 90s,
    /// 2h). Locks of unknown age (values of other Redlock clients) are left out, and counted
    /// on stderr.
    #[arg(long, value_name = "D", value_parser = duration_up_to(MAX_AGE, "3650days"))]
    older_than: Option<Duration>,
    /// List only the keys that start with PREFIX.
    #[arg(default_value = "")]
    prefix: String,
}

/// `redlock break KEY [--value V]`
#[derive(Debug, Args)]
struct BreakArgs {
    /// Revoke only this value (as `redlock status` shows it): nothing is deleted where another
    /// value holds KEY, so a break aimed at a stuck holder cannot take the lock from the next.
    #[arg(long, value_name = "V")]
    value: Option<String>,
    /// The lock's name.
    key: String,
}

fn main() -> ExitCode {
    let cli = match command()
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error(&e)),
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            report(&format_args!("cannot start the async runtime: {e}"));
            return ExitCode::from(EXIT_OS_ERROR);
        }
    };
    let code = runtime.block_on(async {
        let node_timeout = cli.nodes.node_timeout;
        let (code, locks) = match cli.command {
            Command::Run(args) => match client(&cli.nodes, Some(args.ttl)) {
                Ok(locks) => match args.once_per {
                    Some(period) => (
                        once::once_per(locks.clone(), args, period).await,
                        Some(locks),
                    ),
                    None => (run::run(locks.clone(), args).await, Some(locks)),
                },
                Err(e) => (e.fail(), None),
            },
            Command::Elect(args) => match client(&cli.nodes, Some(args.ttl)) {
                Ok(locks) => (elect::elect(locks.clone(), args).await, Some(locks)),
                Err(e) => (e.fail(), None),
            },
            Command::Status(args) => match client(&cli.nodes, None) {
                Ok(locks) => (
                    status::status(locks.clone(), &args.key, args.json).await,
                    Some(locks),
                ),
                Err(e) => (e.fail(), None),
            },
            Command::Check(args) => match client(&cli.nodes, None) {
                Ok(locks) => (
                    check::check(locks.clone(), &args.key, args.token).await,
                    Some(locks),
                ),
                Err(e) => (e.fail(), None),
            },
            Command::Break(args) => match client(&cli.nodes, None) {
                Ok(locks) => (
                    check::brk(locks.clone(), &args.key, args.value.as_deref()).await,
                    Some(locks),
                ),
                Err(e) => (e.fail(), None),
            },
            Command::Ls(args) => match client(&cli.nodes, None) {
                Ok(locks) => (
                    ls::ls(locks.clone(), &args.prefix, args.older_than, args.json).await,
                    Some(locks),
                ),
                Err(e) => (e.fail(), None),
            },
            Command::Demo(args) => (demo::demo(args).await, None),
        };
        // Let the background releases reach the nodes before the process exits.
        if let Some(locks) = locks {
            let _ = tokio::time::timeout(node_timeout, locks.flush()).await;
        }
        code
    });
    ExitCode::from(code)
}

/// This process's id among hosts: `HOST-PID-RANDOM` (an election's candidate id, the
/// instance recorded in a `--once-per` period's marker).
fn instance_id() -> String {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".to_owned());
    format!(
        "{host}-{}-{:04x}",
        std::process::id(),
        rand::random::<u16>()
    )
}

/// Exit code when the operating system refuses something no user input can cause (EX_OSERR).
const EXIT_OS_ERROR: u8 = 71;

/// The longest `--ttl` and `--max-ttl`: the library's limit (Redis' `PX` in practice, 49 days).
const MAX_TTL: Duration = RedlockBuilder::MAX_TTL;
const MAX_TTL_TEXT: &str = "4294967295ms, about 49.7 days";
/// The longest `--node-timeout`: the library's limit for timings (one hour).
const MAX_NODE_TIMEOUT: Duration = RedlockBuilder::MAX_TIMING;
/// The longest `--wait`: a year (beyond it, loop in the caller).
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);
/// The longest `ls --older-than`: ten years.
const MAX_AGE: Duration = Duration::from_secs(3650 * 24 * 3600);
/// The longest `--kill-after`: a day.
const MAX_KILL_AFTER: Duration = Duration::from_secs(24 * 3600);
/// The longest `--once-per` period: a tick's marker lives two periods, which must fit the
/// library's (Redis') limit on a ttl.
const MAX_PERIOD: Duration = Duration::from_secs(24 * 86_400);
const MAX_PERIOD_TEXT: &str = "24days";

/// The shortest `--once-per` period: a shorter one is almost certainly a mistake (a period of
/// 0 would run CMD on every call).
const MIN_PERIOD: Duration = Duration::from_secs(1);

/// The `--once-per` parser: a duration between [`MIN_PERIOD`] and [`MAX_PERIOD`].
fn period_parser() -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    let up_to = duration_up_to(MAX_PERIOD, MAX_PERIOD_TEXT);
    move |s: &str| {
        let d = up_to(s)?;
        if d < MIN_PERIOD {
            return Err("too short: at least 1s".to_owned());
        }
        Ok(d)
    }
}

/// A clap value parser for a humantime duration no longer than `max` (spelt `max_text` in the
/// message): every duration option is bounded, so that no later arithmetic on instants can
/// overflow, and a mistaken value is a usage error (64) naming the limit.
fn duration_up_to(
    max: Duration,
    max_text: &'static str,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        // A bare number is seconds, as flock -w takes it.
        let d = match s.parse::<f64>() {
            Ok(secs) => Duration::try_from_secs_f64(secs).map_err(|e| e.to_string())?,
            Err(_) => humantime::parse_duration(s).map_err(|e| e.to_string())?,
        };
        if d > max {
            return Err(format!("too long: at most {max_text}"));
        }
        Ok(d)
    }
}

/// The command line: [`Cli`], with the node options (global to every other subcommand) hidden
/// from `redlock demo --help`, since the demo starts nodes of its own.
fn command() -> clap::Command {
    let cmd = Cli::command();
    // Hidden copies in `demo` itself: clap propagates a global option only to the subcommands
    // that do not define it already.
    let node_options: Vec<clap::Arg> = cmd
        .get_arguments()
        .filter(|a| a.is_global_set())
        .map(|a| a.clone().hide(true))
        .collect();
    cmd.mut_subcommand("demo", |demo| demo.args(node_options))
}

/// The one place where a library error becomes an exit code (the contract's table).
fn exit_code(e: &Error) -> u8 {
    match e {
        Error::Held { .. } => EXIT_HELD,
        // A quorum that answered too slowly to leave any validity is, for the caller, a quorum
        // that could not be reached in time.
        Error::NoQuorum { .. } | Error::ValidityExpired { .. } => EXIT_NO_QUORUM,
        // One process takes one lock at a time: its own queue cannot outgrow a node timeout.
        // Should it, the lock service was not there in time, as for a quorum not reached.
        Error::Overloaded { .. } => EXIT_NO_QUORUM,
        Error::Lost { .. } => EXIT_LOST,
        Error::PermissionDenied { .. } => EXIT_NOPERM,
        Error::WrongType { .. } => EXIT_WRONG_TYPE,
        Error::InvalidArgument(_) | Error::Config(_) => EXIT_USAGE,
        // `Error` is non-exhaustive: a variant added to the library after this mapping was
        // written is not silently a usage error.
        _ => EXIT_SOFTWARE,
    }
}

/// Prints the one-line cause of a failure on stderr: any control character in it (from a
/// file name, a node, an argument) as a visible escape, so that it stays one line and cannot
/// drive the terminal.
fn report(cause: &dyn Display) {
    use std::io::Write as _;
    let line = status::escape_controls(&cause.to_string());
    let _ = writeln!(std::io::stderr().lock(), "redlock: {line}");
}

/// Reports a library error and returns its exit code.
fn fail(e: &Error) -> u8 {
    report(&describe(e));
    exit_code(e)
}

/// Reports a library error and returns its exit code, `conflict` for a lock held by another
/// owner (`-E`).
fn fail_with(e: &Error, conflict: u8) -> u8 {
    report(&describe(e));
    conflict_exit_code(e, conflict)
}

/// [`exit_code`], with `conflict` in place of 75 for a lock held by another owner.
fn conflict_exit_code(e: &Error, conflict: u8) -> u8 {
    match exit_code(e) {
        EXIT_HELD => conflict,
        code => code,
    }
}

/// The one line that names the cause of a library error.
fn describe(e: &Error) -> String {
    match e {
        Error::Config(ConfigError::NoNodes) => {
            format!("{e} (use --nodes URL,... or REDLOCK_NODES)")
        }
        // The first run against freshly started nodes (a new cluster, a CI service container):
        // say what to do, not only why.
        Error::NoQuorum { failures, .. }
            if failures
                .iter()
                .any(|f| matches!(f.cause, quorumlock::NodeError::HeldOut { .. })) =>
        {
            format!(
                "{e}. Nodes that started less than the max ttl ago are held out, since they may \
                 have lost lock keys in a restart: wait it out (-w/--wait), or, for nodes no \
                 lock can have been held on before (a new cluster, a CI service) or that \
                 persist with appendfsync always, pass --restart-guard off (see the guide \
                 `quorumlock::guide::cli` or docs/cli.md, \"The restart guard\")"
            )
        }
        // The CLI turns fencing off only with --compat.
        Error::Config(ConfigError::FencingRequired) => "--compat (REDLOCK_COMPAT) hands out no \
            fencing tokens, which elections, --once-per, check and break need: use it with \
            `run` and `status` alone"
            .to_owned(),
        // No node failed, so there is none to name: say what the time went to.
        Error::ValidityExpired { key, elapsed, ttl } => format!(
            "the nodes answered too slowly for a quorum on {key:?}: a quorum agreed only after \
             {} of the {} ttl, which left no validity (check the nodes and the network, or use \
             a longer --ttl)",
            humantime::format_duration(round_to_ms(*elapsed)),
            humantime::format_duration(*ttl),
        ),
        _ => e.to_string(),
    }
}

/// A duration cut to whole milliseconds, for messages.
fn round_to_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Help and version go to stdout with exit 0; every other parse error is one line and 64.
fn usage_error(e: &clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = e.print();
            0
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            report(&"a subcommand is required: run, elect, status or demo (see 'redlock --help')");
            EXIT_USAGE
        }
        _ => {
            // clap's message is "error: <cause>" (possibly over a few lines), a blank line, then
            // tips and usage: keep the cause, on one line.
            let rendered = e.render().to_string();
            let cause = rendered
                .split("\n\n")
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            report(&format_args!("{cause} (see 'redlock --help')"));
            EXIT_USAGE
        }
    }
}

/// Library diagnostics (`tracing`) on stderr, off unless `REDLOCK_LOG` asks for them
/// (e.g. `REDLOCK_LOG=warn` or `REDLOCK_LOG=quorumlock=debug`).
fn init_logging() {
    let Ok(filter) = std::env::var("REDLOCK_LOG") else {
        return;
    };
    use std::io::IsTerminal as _;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        // Its own complaint about a closed stderr would go to that stderr, and panic.
        .log_internal_errors(false)
        .try_init();
}

#[cfg(test)]
mod tests;

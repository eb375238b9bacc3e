//! How the library calls its Lua (the scripts themselves are in `node/lua.rs`).
//!
//! Scripts are never loaded beforehand (`SCRIPT LOAD` would cost every new process one command
//! per script and node). A connection's first call of each lock script goes as `EVAL` with its
//! body, which leaves the script in the server's cache; once one has answered, that
//! connection's calls of the script go as `EVALSHA` ([`ScriptsSeen`]). A call never needs a
//! second send on a new connection, so a call kept unpolled after its round (parked) is never
//! stuck waiting to send a fallback. A `NOSCRIPT` reply (someone ran `SCRIPT FLUSH`) still falls
//! back to `EVAL` on the same connection, so ordering between our own calls is kept.
//!
//! A node whose user may not run `EVALSHA` (managed services restrict it with ACL rules such as
//! `-evalsha`), or whose server does not know it (renamed away), gets every script as `EVAL`
//! with its body from its first refused `EVALSHA` on: the node remembers it (logged once, at
//! info; `docs/acl.md`).
//!
//! [`denial`] reads an ACL refusal: a `NOPERM` reply names the command; a refusal inside a
//! script names only the script and its line, which is mapped back to the commands the line
//! calls.
//!
//! The keys the scripts are given are laid out by [`crate::core::keys`].

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::{Cmd, Pipeline};

use super::Node;
pub(crate) use super::lua::{
    ACQUIRE, EXTEND, FENCED_WRITE, LEADER_RESIGN, LEADER_WRITE, Lua, RAISE_COUNTER, RAISE_FENCE,
    RELEASE, REVOKE, STATUS, all, on_lock_nodes,
};
use crate::error::NodeError;

/// One counter raised to `value` (never lowered) by [`RAISE_COUNTER`] sent with its body: the
/// repair's call where the script may not be cached (a Cluster member's per-key call, the
/// fallback after `NOSCRIPT`).
pub(crate) fn raise_counter_eval(key: &[u8], value: u64) -> Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(RAISE_COUNTER.code()).arg(1).arg(key).arg(value);
    cmd
}

impl Lua {
    /// Builds the invocation once; the same call is sent to every node.
    pub(crate) fn call(&'static self, keys: &[&[u8]], args: &[&[u8]]) -> ScriptCall {
        // Sized once: growing a command's buffers costs an allocation per doubling.
        let hash = self.script().get_hash();
        let data: usize = keys.iter().chain(args).map(|a| a.len()).sum();
        let mut evalsha =
            redis::Cmd::with_capacity(3 + keys.len() + args.len(), 7 + hash.len() + 3 + data);
        evalsha.arg("EVALSHA").arg(hash).arg(keys.len());
        for k in keys {
            evalsha.arg(*k);
        }
        for a in args {
            evalsha.arg(*a);
        }
        ScriptCall {
            lua: Some(self),
            cmd: evalsha,
            pipe: None,
            lean: None,
        }
    }
}

/// Per lock script ([`on_lock_nodes`]), the connection generation on which the node was last
/// seen to have it cached (an `EVAL` of it answered there; 0: never): a call on that
/// generation goes as `EVALSHA`, on any other as `EVAL` with the body, which caches it.
#[derive(Debug, Default)]
pub(crate) struct ScriptsSeen([AtomicU64; 6]);

impl ScriptsSeen {
    /// Where `lua` sits in [`on_lock_nodes`]; `None` for a script no lock node runs by its hash.
    fn slot(&self, lua: &Lua) -> Option<&AtomicU64> {
        let i = on_lock_nodes().iter().position(|l| std::ptr::eq(*l, lua))?;
        self.0.get(i)
    }

    /// Whether `call`'s script is known to be cached on the connection of `generation`
    /// (true for a plain command and for a script that is not a lock script's).
    pub(super) fn cached(&self, call: &ScriptCall, generation: u64) -> bool {
        call.lua
            .and_then(|lua| self.slot(lua))
            .is_none_or(|g| g.load(Ordering::Relaxed) == generation)
    }

    /// `call`'s script answered as `EVAL` on the connection of `generation`: it is cached there.
    pub(super) fn saw(&self, call: &ScriptCall, generation: u64) {
        if let Some(g) = call.lua.and_then(|lua| self.slot(lua)) {
            g.store(generation, Ordering::Relaxed);
        }
    }
}

/// Which forms of the fenced acquire a round builds ([`ScriptCall::fenced_acquire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AcquireForms {
    /// The [`ACQUIRE`] script, for nodes that do not take the pipelined form.
    pub(crate) script: bool,
    /// `SET NX PX GET` + `INCR`, for nodes that do.
    pub(crate) pipelined: bool,
}

/// A ready-to-send invocation: a script by its SHA1, or (fencing off) a plain command; for the
/// fenced acquire also (or only) its pipelined form, `SET NX PX GET` + `INCR` (`node/acquire_form.rs`).
#[derive(Debug)]
pub(crate) struct ScriptCall {
    lua: Option<&'static Lua>,
    /// Empty (`Cmd::new()`, no allocation) when only the pipelined form was built: the script
    /// form is then rebuilt from it if a node needs it after all (see [`Self::evalsha`]).
    cmd: Cmd,
    pipe: Option<Pipeline>,
    /// A leaner call for the nodes whose connection is known to have seen the lock's token
    /// (see [`Self::with_lean`]).
    lean: Option<Box<Lean>>,
}

/// The lean form of a call, and where it applies: node `i` takes it when its connection's
/// generation is `on[i]` (`0`: never).
#[derive(Debug)]
struct Lean {
    call: ScriptCall,
    on: smallvec::SmallVec<[u64; 8]>,
}

impl ScriptCall {
    /// Gives this call a lean form for the nodes whose counter is known to stand at or above
    /// the lock's token: node `i` gets `lean` instead when its call runs on connection
    /// generation `on[i]` ([`Node::process_generation`] taken before the round that saw the
    /// counter there; `0` never matches). The lean form differs only by skipping a counter
    /// raise that would do nothing there: counters never decrease while the server process
    /// lives, and a connection's generation names one process (`docs/safety.md`, "Release
    /// raises counters everywhere"). `lean` is built only when some node may take it.
    pub(crate) fn with_lean(mut self, on: &[u64], lean: impl FnOnce() -> ScriptCall) -> Self {
        if on.iter().any(|&g| g != 0) {
            self.lean = Some(Box::new(Lean {
                call: lean(),
                on: on.into(),
            }));
        }
        self
    }

    /// The form node `index` is sent on connection generation `generation`.
    pub(crate) fn for_node(&self, index: usize, generation: u64) -> &ScriptCall {
        match &self.lean {
            Some(lean) if generation != 0 && lean.on.get(index) == Some(&generation) => &lean.call,
            _ => self,
        }
    }

    /// A plain command with no script behind it.
    pub(crate) fn plain(cmd: Cmd) -> Self {
        ScriptCall {
            lua: None,
            cmd,
            pipe: None,
            lean: None,
        }
    }

    /// The fenced acquire of one round on `lock` and its counter `fence`: the [`ACQUIRE`]
    /// script's call when `forms.script`, its pipelined form `SET lock value NX PX ttl GET` +
    /// `INCR fence` when `forms.pipelined` (both when the round's nodes take both; at least one
    /// is built). Sized once.
    pub(crate) fn fenced_acquire(
        lock: &str,
        fence: &str,
        value: &str,
        ttl_ms: u64,
        forms: AcquireForms,
    ) -> Self {
        let AcquireForms { script, pipelined } = forms;
        let mut digits = itoa::Buffer::new();
        let ttl = digits.format(ttl_ms).as_bytes();
        let mut call = if script || !pipelined {
            ACQUIRE.call(
                &[lock.as_bytes(), fence.as_bytes()],
                &[value.as_bytes(), ttl],
            )
        } else {
            ScriptCall {
                lua: Some(&ACQUIRE),
                cmd: Cmd::new(),
                pipe: None,
                lean: None,
            }
        };
        if pipelined {
            let mut pipe = Pipeline::with_capacity(2);
            let mut set = Cmd::with_capacity(7, 3 + lock.len() + value.len() + 4 + ttl.len() + 3);
            set.arg("SET")
                .arg(lock)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl)
                .arg("GET");
            let mut incr = Cmd::with_capacity(2, 4 + fence.len());
            incr.arg("INCR").arg(fence);
            pipe.add_command(set).add_command(incr);
            call.pipe = Some(pipe);
        }
        call
    }

    /// The pipelined form of a fenced acquire, if built.
    pub(crate) fn pipelined(&self) -> Option<&Pipeline> {
        self.pipe.as_ref()
    }

    /// The command as sent to a node that runs the script (or the plain command).
    pub(crate) fn evalsha(&self) -> Cow<'_, Cmd> {
        match &self.pipe {
            Some(pipe) if self.cmd.args_iter().len() == 0 => Cow::Owned(script_form(pipe)),
            _ => Cow::Borrowed(&self.cmd),
        }
    }

    /// The script's first argument (`ARGV[1]`: our value, for the acquire), if it runs a script.
    pub(crate) fn first_arg(&self) -> Option<Vec<u8>> {
        self.lua?;
        let cmd = self.evalsha();
        let mut args = cmd.args_iter().skip(2);
        let numkeys: usize = match args.next()? {
            redis::Arg::Simple(n) => std::str::from_utf8(n).ok()?.parse().ok()?,
            _ => return None,
        };
        match args.nth(numkeys)? {
            redis::Arg::Simple(v) => Some(v.to_vec()),
            _ => None,
        }
    }

    /// Whether this call runs a script (and so has an `EVAL` form).
    pub(crate) fn is_script(&self) -> bool {
        self.lua.is_some()
    }

    /// The `EVAL` form, used only after a `NOSCRIPT` reply: the same arguments as the `EVALSHA`
    /// (numkeys, keys, args), with the body in place of the hash.
    pub(crate) fn eval(&self) -> Option<Cmd> {
        let lua = self.lua?;
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(lua.code());
        for arg in self.evalsha().args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        Some(cmd)
    }
}

/// The acquire script's `EVALSHA` rebuilt from the pipelined form (a cold path: a node that
/// switched to the script between the call's building and its sending, e.g. reconnected to a
/// server of an older version).
fn script_form(pipe: &Pipeline) -> Cmd {
    let mut cmds = pipe.cmd_iter();
    let arg = |cmd: Option<&Cmd>, i: usize| -> Vec<u8> {
        match cmd.and_then(|c| c.args_iter().nth(i)) {
            Some(redis::Arg::Simple(b)) => b.to_vec(),
            _ => Vec::new(),
        }
    };
    let set = cmds.next();
    let incr = cmds.next();
    let (lock, value, ttl, fence) = (arg(set, 1), arg(set, 2), arg(set, 5), arg(incr, 1));
    ACQUIRE.call(&[&lock, &fence], &[&value, &ttl]).cmd
}

/// Reads an ACL refusal out of a server error: `None` for any other error.
///
/// Redis 7 words them three ways: `NOPERM ... the 'incr' command` (a command sent, named);
/// `NOPERM ... one of the keys` / `channels` (a key or channel outside the user's patterns;
/// the command is `sent`, when known); and, for a command a script calls, an `ERR` that names
/// only the script's SHA1 and line (`... can't run this command ... script: SHA, on
/// @user_script:N.`): the line is looked up in our scripts and its `redis.call`s named.
pub(crate) fn denial(e: &redis::RedisError, sent: Option<&str>) -> Option<NodeError> {
    let detail = e.detail().unwrap_or_default();
    let in_script = detail.contains("@user_script:")
        && [
            "can't run",
            "can't access",
            "can't publish",
            "no permissions",
        ]
        .iter()
        .any(|p| detail.contains(p));
    if e.kind() != redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) && !in_script {
        return None;
    }
    let reason = if detail.contains("keys") {
        "a key outside the user's key patterns"
    } else if detail.contains("channel") {
        "a channel outside the user's channel patterns"
    } else {
        COMMAND_REFUSED
    };
    let named = detail
        .split_once('\'')
        .and_then(|(_, rest)| rest.split_once("' command"))
        .map(|(name, _)| name.to_ascii_uppercase());
    let command = named
        .or_else(|| in_script.then(|| script_line_commands(detail)).flatten())
        .or_else(|| sent.map(str::to_ascii_uppercase))
        .unwrap_or_else(|| "a command".to_owned());
    Some(NodeError::Denied { command, reason })
}

/// The commands called on the line of one of our scripts that a script error names
/// (`script: SHA, on @user_script:N.`), as `GET` or `GET or PTTL`.
fn script_line_commands(detail: &str) -> Option<String> {
    let (_, after) = detail.split_once("script: ")?;
    let sha = after.split(',').next()?.trim();
    let line: usize = after
        .split_once("@user_script:")?
        .1
        .trim_end_matches('.')
        .trim()
        .parse()
        .ok()?;
    let lua = all().find(|l| l.script().get_hash() == sha)?;
    let text = lua.code().lines().nth(line.checked_sub(1)?)?;
    let mut names: Vec<&str> = Vec::new();
    for piece in text.split("redis.call('").skip(1) {
        if let Some((name, _)) = piece.split_once('\'')
            && !names.contains(&name)
        {
            names.push(name);
        }
    }
    (!names.is_empty()).then(|| names.join(" or "))
}

impl Node {
    /// Whether `e` is this node refusing `EVALSHA` itself: the node then gets its scripts as
    /// `EVAL` from now on.
    /// A server that does not know `EVALSHA` (renamed away) is treated alike.
    pub(super) fn evalsha_refused(&self, e: &redis::RedisError) -> bool {
        let refused = matches!(
            denial(e, None),
            Some(NodeError::Denied { command, reason: COMMAND_REFUSED }) if command == "EVALSHA"
        ) || unknown_command(e).is_some_and(|c| c == "EVALSHA");
        if refused {
            self.use_eval("EVALSHA");
        }
        refused
    }

    /// Sends every script to this node as `EVAL` with its body from now on (logged once per
    /// node, at info: it works, each call carries the script's body).
    pub(super) fn use_eval(&self, refused: &str) {
        self.by_eval.store(true, Ordering::Relaxed);
        if !self.by_eval_logged.swap(true, Ordering::Relaxed) {
            tracing::info!(
                node = %self.name,
                refused,
                "the node refuses {refused}: scripts are sent to it as EVAL with their body \
                 from now on (the lock works; each call carries the script)"
            );
        }
    }

    /// Whether scripts go to this node as `EVAL` with their body (`EVALSHA` refused).
    pub(crate) fn scripts_by_eval(&self) -> bool {
        self.by_eval.load(Ordering::Relaxed)
    }
}

/// The command a server error says it does not know (`ERR unknown command 'evalsha', ...`),
/// upper-cased.
pub(super) fn unknown_command(e: &redis::RedisError) -> Option<String> {
    let (_, rest) = e.detail()?.split_once("unknown command '")?;
    let (name, _) = rest.split_once('\'')?;
    Some(name.to_ascii_uppercase())
}

/// [`NodeError::Denied`]'s reason for a command the user may not run.
const COMMAND_REFUSED: &str = "command not allowed";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eval_fallback_carries_the_same_keys_and_arguments() {
        let call = ACQUIRE.call(&[b"k1", b"k2"], &[b"v", b"100"]);
        let eval = call.eval().unwrap();
        let args: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                _ => Vec::new(),
            })
            .collect();
        let expected: Vec<&[u8]> = vec![
            b"EVAL",
            ACQUIRE.code().as_bytes(),
            b"2",
            b"k1",
            b"k2",
            b"v",
            b"100",
        ];
        assert_eq!(args, expected);
        assert!(ScriptCall::plain(redis::cmd("PING")).eval().is_none());
    }

    /// A server error as the connection would hand it over.
    #[test]
    fn a_script_form_rebuilt_from_the_pipelined_one_is_the_one_built_directly() {
        let (lock, fence) = ("quorumlock:{job}", "quorumlock:fence:{x}");
        let script = AcquireForms {
            script: true,
            pipelined: false,
        };
        let pipelined = AcquireForms {
            script: false,
            pipelined: true,
        };
        let direct = ScriptCall::fenced_acquire(lock, fence, "v1", 30_000, script);
        let rebuilt = ScriptCall::fenced_acquire(lock, fence, "v1", 30_000, pipelined);
        assert!(direct.pipelined().is_none() && rebuilt.pipelined().is_some());
        assert_eq!(
            rebuilt.evalsha().get_packed_command(),
            direct.evalsha().get_packed_command()
        );
    }

    fn server_error(line: &str) -> redis::RedisError {
        let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
        value.extract_error().unwrap_err()
    }

    fn denied(line: &str, sent: Option<&str>) -> Option<(String, &'static str)> {
        match denial(&server_error(line), sent)? {
            NodeError::Denied { command, reason } => Some((command, reason)),
            other => panic!("{other}"),
        }
    }

    /// The three shapes Redis 7.0 gives an ACL refusal (as observed against redis-server
    /// 7.0.15), and an error that is none of them.
    #[test]
    fn a_refusal_names_its_command() {
        assert_eq!(
            denied(
                "NOPERM this user has no permissions to run the 'script|load' command",
                None
            ),
            Some(("SCRIPT|LOAD".to_owned(), COMMAND_REFUSED))
        );
        assert_eq!(
            denied(
                "NOPERM this user has no permissions to access one of the keys used as arguments",
                Some("evalsha")
            ),
            Some((
                "EVALSHA".to_owned(),
                "a key outside the user's key patterns"
            ))
        );
        let in_script = |line: usize| {
            format!(
                "ERR The user executing the script can't run this command or subcommand script: \
                 {}, on @user_script:{line}.",
                STATUS.script().get_hash()
            )
        };
        // STATUS's second line calls GET, PTTL and GET.
        assert_eq!(
            denied(&in_script(2), None),
            Some(("GET or PTTL".to_owned(), COMMAND_REFUSED))
        );
        let incr_line = ACQUIRE
            .code()
            .lines()
            .position(|l| l.contains("'INCR'"))
            .unwrap();
        let acquire = format!(
            "ERR The user executing the script can't publish to the channel mentioned in the \
             command script: {}, on @user_script:{}.",
            ACQUIRE.script().get_hash(),
            incr_line + 1
        );
        assert_eq!(
            denied(&acquire, None),
            Some((
                "INCR".to_owned(),
                "a channel outside the user's channel patterns"
            ))
        );
        assert_eq!(denied("ERR unknown command 'CONFIG'", None), None);
        assert_eq!(
            unknown_command(&server_error(
                "ERR unknown command 'evalsha', with args beginning with: 'abc' '1'"
            )),
            Some("EVALSHA".to_owned())
        );
        assert_eq!(
            unknown_command(&server_error("NOSCRIPT No matching script.")),
            None
        );
        assert_eq!(denied("NOSCRIPT No matching script.", None), None);
    }
}

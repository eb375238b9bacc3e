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

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::{Cmd, Pipeline};

use super::Node;
pub(crate) use super::lua::{
    ACQUIRE, EXTEND, FENCED_WRITE, LEADER_RESIGN, LEADER_WRITE, Lua, RAISE_COUNTER, RAISE_FENCE,
    RELEASE, REVOKE, STATUS, all, on_lock_nodes,
};
use super::resp::pack;
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
    /// The call of this script with `keys` and `args`; the same call is sent to every node.
    pub(crate) fn call(&'static self, keys: &[&[u8]], args: &[&[u8]]) -> ScriptCall {
        ScriptCall {
            lua: Some(self),
            invocation: Invocation::new(keys, args),
            cmd: OnceLock::new(),
            packed: OnceLock::new(),
            pipe: None,
            lean: None,
        }
    }
}

/// A script's keys and arguments, kept apart (as redis-rs's `ScriptInvocation` keeps them):
/// every command form of the call is built from them, and nothing reads a built command back.
/// One buffer, inline up to a size that holds the lock scripts' usual keys and values, so that
/// keeping them costs no allocation.
#[derive(Debug)]
struct Invocation {
    /// The keys' bytes, then the arguments'.
    bytes: smallvec::SmallVec<[u8; 192]>,
    /// Where each key, then each argument, ends in `bytes`.
    ends: smallvec::SmallVec<[usize; 6]>,
    /// How many of `ends` are keys'.
    keys: usize,
}

impl Invocation {
    fn new(keys: &[&[u8]], args: &[&[u8]]) -> Self {
        let mut bytes = smallvec::SmallVec::new();
        let mut ends = smallvec::SmallVec::new();
        for part in keys.iter().chain(args) {
            bytes.extend_from_slice(part);
            ends.push(bytes.len());
        }
        Invocation {
            bytes,
            ends,
            keys: keys.len(),
        }
    }

    /// The keys, then the arguments.
    fn parts(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(self.ends.iter().copied())
            .map(|(start, end)| &self.bytes[start..end])
    }

    /// The arguments (`ARGV`).
    fn args(&self) -> impl Iterator<Item = &[u8]> {
        self.parts().skip(self.keys)
    }

    /// The words of `name script numkeys keys… args…` (`numkeys` written into `digits`):
    /// `EVALSHA` with the script's hash, or `EVAL` with its body.
    fn words<'a>(
        &'a self,
        name: &'a str,
        script: &'a str,
        digits: &'a mut itoa::Buffer,
    ) -> smallvec::SmallVec<[&'a [u8]; 9]> {
        let numkeys = digits.format(self.keys);
        let mut words: smallvec::SmallVec<[&[u8]; 9]> =
            smallvec::smallvec![name.as_bytes(), script.as_bytes(), numkeys.as_bytes()];
        words.extend(self.parts());
        words
    }

    /// [`words`](Self::words) as redis-rs's command, sized once (growing a command's buffers
    /// costs an allocation per doubling).
    fn command(&self, name: &str, script: &str) -> Cmd {
        let mut digits = itoa::Buffer::new();
        let words = self.words(name, script, &mut digits);
        let mut cmd = Cmd::with_capacity(words.len(), words.iter().map(|w| w.len()).sum());
        for word in words {
            cmd.arg(word);
        }
        cmd
    }

    /// [`words`](Self::words) in RESP.
    fn packed(&self, name: &str, script: &str) -> Vec<u8> {
        let mut out = Vec::new();
        pack(
            &mut out,
            &self.words(name, script, &mut itoa::Buffer::new()),
        );
        out
    }

    /// A fenced acquire's pipelined form, `SET lock value NX PX ttl GET` then `INCR fence`,
    /// from the acquire script's keys (lock, fence) and arguments (value, ttl).
    fn pipelined_words(&self) -> ([&[u8]; 7], [&[u8]; 2]) {
        let mut parts = self.parts();
        let mut next = || parts.next().unwrap_or_default();
        let (lock, fence, value, ttl) = (next(), next(), next(), next());
        (
            [b"SET", lock, value, b"NX", b"PX", ttl, b"GET"],
            [b"INCR", fence],
        )
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

/// A ready-to-send invocation: a script (its keys and arguments, sent by its SHA1, or with its
/// body as `EVAL`), or (fencing off) a plain command; for the fenced acquire also its pipelined
/// form, `SET NX PX GET` + `INCR` (`node/acquire_form.rs`).
#[derive(Debug)]
pub(crate) struct ScriptCall {
    lua: Option<&'static Lua>,
    /// The script's keys and arguments (empty for a plain command).
    invocation: Invocation,
    /// The `EVALSHA` built from `invocation` when a node first needs it (a fenced acquire that
    /// every node takes pipelined never builds it), or the plain command.
    cmd: OnceLock<Cmd>,
    /// The same command in RESP, packed once for every node the call goes to.
    packed: OnceLock<Vec<u8>>,
    pipe: Option<Pipelined>,
    /// A leaner call for the nodes whose connection is known to have seen the lock's token
    /// (see [`Self::with_lean`]).
    lean: Option<Box<Lean>>,
}

/// A fenced acquire's pipelined form: in RESP for the crate's connections, and as redis-rs's
/// pipeline (built when a `rediss://` node first needs it).
#[derive(Debug)]
struct Pipelined {
    packed: Vec<u8>,
    pipe: OnceLock<Pipeline>,
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
            invocation: Invocation::new(&[], &[]),
            cmd: OnceLock::from(cmd),
            packed: OnceLock::new(),
            pipe: None,
            lean: None,
        }
    }

    /// The fenced acquire of one round on `lock` and its counter `fence`: the [`ACQUIRE`]
    /// script's call (its command built only if a node runs it), and, when `pipelined`, its
    /// pipelined form `SET lock value NX PX ttl GET` + `INCR fence`, sized once.
    pub(crate) fn fenced_acquire(
        lock: &str,
        fence: &str,
        value: &str,
        ttl_ms: u64,
        pipelined: bool,
    ) -> Self {
        let mut digits = itoa::Buffer::new();
        let ttl = digits.format(ttl_ms).as_bytes();
        let mut call = ACQUIRE.call(
            &[lock.as_bytes(), fence.as_bytes()],
            &[value.as_bytes(), ttl],
        );
        if pipelined {
            let (set, incr) = call.invocation.pipelined_words();
            let mut packed = Vec::new();
            pack(&mut packed, &set);
            pack(&mut packed, &incr);
            call.pipe = Some(Pipelined {
                packed,
                pipe: OnceLock::new(),
            });
        }
        call
    }

    /// Whether this call has the pipelined form of a fenced acquire.
    pub(crate) fn is_pipelined(&self) -> bool {
        self.pipe.is_some()
    }

    /// The pipelined form in RESP (two commands), if built.
    pub(crate) fn pipelined_packed(&self) -> Option<&[u8]> {
        self.pipe.as_ref().map(|p| p.packed.as_slice())
    }

    /// The pipelined form as redis-rs's pipeline, if built: `SET lock value NX PX ttl GET`,
    /// `INCR fence`, from the acquire script's keys and arguments.
    pub(crate) fn pipelined(&self) -> Option<&Pipeline> {
        let p = self.pipe.as_ref()?;
        Some(p.pipe.get_or_init(|| {
            let (set, incr) = self.invocation.pipelined_words();
            let mut pipe = Pipeline::with_capacity(2);
            for words in [&set[..], &incr[..]] {
                let mut cmd = Cmd::new();
                for word in words {
                    cmd.arg(*word);
                }
                pipe.add_command(cmd);
            }
            pipe
        }))
    }

    /// [`evalsha`](Self::evalsha) in RESP.
    pub(crate) fn evalsha_packed(&self) -> &[u8] {
        self.packed.get_or_init(|| match self.lua {
            Some(lua) => self.invocation.packed("EVALSHA", lua.script().get_hash()),
            None => self.evalsha().get_packed_command(),
        })
    }

    /// The command as sent to a node that runs the script by its hash (or the plain command).
    pub(crate) fn evalsha(&self) -> &Cmd {
        self.cmd.get_or_init(|| match self.lua {
            Some(lua) => self.invocation.command("EVALSHA", lua.script().get_hash()),
            // A plain call's command is set when it is built.
            None => Cmd::new(),
        })
    }

    /// The script's first argument (`ARGV[1]`: our value, for the acquire), if it runs a script.
    pub(crate) fn first_arg(&self) -> Option<&[u8]> {
        self.lua?;
        self.invocation.args().next()
    }

    /// Whether this call runs a script (and so has an `EVAL` form).
    pub(crate) fn is_script(&self) -> bool {
        self.lua.is_some()
    }

    /// The `EVAL` form (a connection's first call of the script, a node that refuses
    /// `EVALSHA`, a `NOSCRIPT` reply): the same keys and arguments as the `EVALSHA`, with the
    /// body in place of the hash.
    pub(crate) fn eval(&self) -> Option<Cmd> {
        let lua = self.lua?;
        Some(self.invocation.command("EVAL", lua.code()))
    }
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

    #[test]
    fn a_fenced_acquire_s_script_form_is_built_from_its_keys_and_arguments() {
        let (lock, fence) = ("quorumlock:{job}", "quorumlock:fence:{x}");
        let script = ScriptCall::fenced_acquire(lock, fence, "v1", 30_000, false);
        let both = ScriptCall::fenced_acquire(lock, fence, "v1", 30_000, true);
        assert!(script.pipelined().is_none() && both.pipelined().is_some());
        // The pipelined form's bytes are redis-rs's packing of the same pipeline.
        assert_eq!(
            both.pipelined_packed(),
            Some(&both.pipelined().unwrap().get_packed_pipeline()[..])
        );
        let direct = ACQUIRE.call(&[lock.as_bytes(), fence.as_bytes()], &[b"v1", b"30000"]);
        for call in [&script, &both] {
            assert_eq!(
                call.evalsha().get_packed_command(),
                direct.evalsha().get_packed_command()
            );
            assert_eq!(
                call.evalsha_packed(),
                &direct.evalsha().get_packed_command()[..]
            );
            assert_eq!(call.first_arg(), Some(&b"v1"[..]));
        }
        assert_eq!(ScriptCall::plain(redis::cmd("PING")).first_arg(), None);
    }

    /// A server error as the connection would hand it over.
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

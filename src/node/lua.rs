//! Every Lua script the library runs, in one place, each with its KEYS, ARGV and reply: the
//! lock's scripts (run on every lock node by `EVALSHA`, [`on_lock_nodes`]), an election's two
//! (sent with their body once per term) and `fenced_set`'s (run on the user's own Redis). How a
//! script is called, and its `EVAL` fallback, is `scripts.rs`'s.

use std::sync::LazyLock;

use redis::Script;

/// A Lua script with its body (for the `EVAL` fallback) and its SHA1 (for `EVALSHA`).
#[derive(Debug)]
pub(crate) struct Lua {
    code: &'static str,
    script: Script,
}

impl Lua {
    pub(super) fn new(code: &'static str) -> Self {
        Lua {
            code,
            script: Script::new(code),
        }
    }

    pub(crate) fn code(&self) -> &'static str {
        self.code
    }

    pub(crate) fn script(&self) -> &Script {
        &self.script
    }
}

/// The scripts a lock node runs (by `EVALSHA`; `EVAL` on `NOSCRIPT`): every script but [`FENCED_WRITE`], which
/// runs on the user's own Redis (`fencing::fenced_set`, whose `invoke_async` loads it there
/// on its first `NOSCRIPT`), never on a lock node, and an election's two, sent with their body
/// once per term.
pub(crate) fn on_lock_nodes() -> [&'static Lua; 6] {
    [
        &ACQUIRE,
        &RAISE_COUNTER,
        &RAISE_FENCE,
        &EXTEND,
        &RELEASE,
        &STATUS,
    ]
}

/// Every script of the crate, for reading a refusal that names one (`denial`).
pub(crate) fn all() -> impl Iterator<Item = &'static Lua> {
    on_lock_nodes().into_iter().chain([
        &*FENCED_WRITE,
        &*LEADER_WRITE,
        &*LEADER_RESIGN,
        &*MARK_WAITING,
    ])
}

/// A waiting client's mark (`client/wait.rs`; sent as `EVAL` with its body when a client starts
/// waiting for a key and every 3 s while it waits, never loaded): adds its id to the waiters
/// marker and sets the waiters count to the marker's size, both with the marker's expiry. The
/// release reads the count, not the set ([`RELEASE`]).
///
/// - KEYS[1]: waiters marker (a set), KEYS[2]: waiters count
/// - ARGV[1]: the client's id, ARGV[2]: the expiry in milliseconds
/// - Reply: the number of waiting clients.
pub(crate) static MARK_WAITING: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local n = redis.call('SCARD', KEYS[1])
redis.call('SET', KEYS[2], n, 'PX', ARGV[2])
return n
"#,
    )
});

/// An election's leader record, written on a node where this term's lock value stands
/// (`election/record.rs`; sent as `EVAL` with its body, once per term, never loaded).
///
/// - KEYS[1]: lock key, KEYS[2]: leader record
/// - ARGV[1]: this term's lock value, ARGV[2]: the record
/// - Reply: 1 when written, 0 when the node does not hold our value (it missed the
///   acquisition, or the key expired there).
pub(crate) static LEADER_WRITE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[2], ARGV[2])
  return 1
end
return 0
"#,
    )
});

/// An election's resignation: deletes our leader record (only if it is still exactly ours) and
/// announces it (`election/record.rs`; sent as `EVAL` with its body, never loaded).
///
/// - KEYS[1]: leader record
/// - ARGV[1]: our record (empty when none was written), ARGV[2]: channel, ARGV[3]: message
/// - Reply: the number of subscribers that received the message.
pub(crate) static LEADER_RESIGN: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return redis.call('PUBLISH', ARGV[2], ARGV[3])
"#,
    )
});

/// Acquire and fence in one atomic step: the fenced acquire of nodes that do not take the
/// pipelined form (`SET NX PX GET` + `INCR`, [`ScriptCall::fenced_acquire`], `node/acquire_form.rs`):
/// Redis 6 and Redis Cluster members. Both forms reply alike, and
/// mix safely in one client (`docs/safety.md`, "The pipelined increment"): the pipelined form
/// also `INCR`s where the `SET` was refused, and its `INCR` is not atomic with the `SET`.
///
/// - KEYS[1]: lock key, KEYS[2]: fencing counter (the bucket of the lock key's hash slot, shared
///   with the other lock keys of that slot; never expires)
/// - ARGV[1]: our unique value, ARGV[2]: ttl in milliseconds
/// - Reply: the counter after `INCR` (>= 1) when the key was set; the value that holds the key
///   (a bulk string) when another value holds it, so that a refused round can tell a holder on
///   a quorum from contenders that split the nodes. The success path is unchanged; a refusal
///   costs one `GET` inside the script. (`0` if the key vanished in between, which a script's
///   frozen clock rules out; it counts as a refusal whose value is unknown.)
///
/// With fencing off, the plain `SET NX PX` answers nil on refusal, without the value (`SET ...
/// NX GET` needs Redis 7): such refusals count as unknown values, and contention is then never
/// declared (the round reads as `Held`).
pub(crate) static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return redis.call('GET', KEYS[1]) or 0
"#,
    )
});

/// Raise a node's fencing counter to the round's token, only while we still own the key there.
/// (The counter is shared with the other lock keys of its slot: raising it only makes their
/// later tokens larger.)
///
/// - KEYS[1]: lock key, KEYS[2]: fencing counter
/// - ARGV[1]: our value, ARGV[2]: the token
/// - Reply: `1` when the counter now stands at or above the token, `0` when the key is not ours.
pub(crate) static RAISE_FENCE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local c = tonumber(redis.call('GET', KEYS[2]) or '0')
if c < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
"#,
    )
});

/// Raise one fencing counter to at least a value (restoring a restarted node's counters).
///
/// - KEYS[1]: fencing counter
/// - ARGV[1]: the value
/// - Reply: `1` raised, `0` already at or above it.
pub(crate) static RAISE_COUNTER: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
if tonumber(redis.call('GET', KEYS[1]) or '0') < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], ARGV[1])
  return 1
end
return 0
"#,
    )
});

/// Extend our lock; re-set it where it vanished (a node restarted empty, or never ran our
/// acquire) unless someone may have held the lock since our acquisition, and keep that node's
/// fencing counter at or above our token.
///
/// Where our value is present it is only `PEXPIRE`d. Where the key is absent it is re-set only
/// if the node's counter is at most our token. After any later acquisition (token `t2` above
/// ours) a quorum of nodes has a counter of at least `t2` (the acquisition's raise guarantees
/// it, and releases raise counters too; counters never go down), and none of those nodes can
/// hold our value again (its holder's `SET NX` found our key gone, and this script refuses to
/// re-set it there): so once someone else acquired after us, an extension collects fewer than
/// a quorum of yes, however late its calls land (`docs/safety.md`, "Late extensions"). A
/// counter above our token on a node where our key is absent may also come from a contender's
/// failed attempt there, or from another lock key sharing the counter (its bucket); the node is
/// then not re-set, and the lock stands on the nodes that hold it. A token of 0 (fencing off: no
/// counters) never re-sets an absent key, for the same reason.
///
/// Where our value is present and the node's counter is known to stand at or above our token
/// (its `INCR` returned the token on the connection this call runs on), the call carries a
/// fourth argument and the script only `PEXPIRE`s: the counter is not read, and the raise it
/// skips would do nothing there (`ScriptCall::with_lean`). Where the key is absent it reads
/// the counter either way (the re-set rule needs it).
///
/// - KEYS[1]: lock key, KEYS[2]: fencing counter (absent in compat mode, where ARGV[3] is 0
///   and ARGV[4] present, so the script never reads it)
/// - ARGV[1]: our value, ARGV[2]: new ttl in milliseconds, ARGV[3]: our token (0: fencing off),
///   ARGV[4] (optional): present when the counter is known at or above the token here
/// - Reply: `1` extended, `2` re-set on a node that had lost the key, `0` another value holds
///   it, or it is absent and may have been held by someone else since (not re-set).
pub(crate) static EXTEND: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local v = redis.call('GET', KEYS[1])
local t = tonumber(ARGV[3])
local r = 1
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if ARGV[4] then
    return 1
  end
elseif v ~= false or t == 0 then
  return 0
else
  r = 2
end
local c = tonumber(redis.call('GET', KEYS[2]) or '0')
if r == 2 then
  if c > t then
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
if c < t then
  redis.call('SET', KEYS[2], ARGV[3])
end
return r
"#,
    )
});

/// Release our lock, and bring the node's fencing counter up to our token.
///
/// Raising a counter is always safe (it only makes later tokens larger), so it is done even
/// where the key is no longer ours. Releases go to every node, so after a release every node
/// that answered stands at or above the token: a later loss of a minority's data cannot make
/// tokens go backwards (see `docs/safety.md`).
///
/// When it deletes the key and the waiters count stands (`quorumlock:{K}:waiters:n`: set with
/// the waiters marker, a set of the ids of the clients that wait for this lock, by each waiting
/// client), it publishes `"<our value> <waiting clients>"` on the marker's channel
/// (`quorumlock:{K}:waiters`), so that the waiters try at once.
///
/// Every key the call names is read in one `MGET` (they share the lock key's hash slot): the
/// lock key, the waiters count and, where the counter must be raised, the counter. Without a
/// waiter the release runs the same two commands as a plain compare-and-delete (`MGET`, `DEL`)
/// and publishes nothing (`client/wait.rs`), whether or not it checks the counter; it writes the
/// counter only where it stands below the token (a counter equal to the token, the usual case,
/// is told by comparing the two strings, without parsing either).
///
/// The call carries only what its node needs: the counter and the token only where the counter
/// must be checked (a node whose counter is known to stand at the token already gets neither:
/// `ScriptCall::with_lean`; nor does the undo of a failed attempt, which has no token), and the
/// waiters count only where a release may publish. Each key and argument of a script call costs
/// the node time to pass into Lua (`tools/compare/release-forms.py` measures each form).
///
/// - KEYS[1]: lock key; KEYS[2] (optional): waiters count, the channel being the lock key's
///   waiters marker (omitted in compat mode, and by the undo of an attempt that did not win: it
///   publishes nothing, `Engine::release_on`); KEYS[3] (with ARGV[2]): fencing counter
/// - ARGV[1]: our value; ARGV[2] (optional, with KEYS[2] and KEYS[3]): our token, to raise the
///   counter to
/// - Reply: `1` deleted, `0` the key is absent, `-1` another value holds it (left alone).
pub(crate) static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local v, r
if KEYS[3] then
  r = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3])
  local t = ARGV[2]
  if r[3] ~= t and tonumber(r[3] or '0') < tonumber(t) then
    redis.call('SET', KEYS[3], t)
  end
  v = r[1]
elseif KEYS[2] then
  r = redis.call('MGET', KEYS[1], KEYS[2])
  v = r[1]
else
  v = redis.call('GET', KEYS[1])
end
if v == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if r and r[2] then
    redis.call('PUBLISH', KEYS[1] .. ':waiters', ARGV[1] .. ' ' .. r[2])
  end
  return 1
end
if v == false then
  return 0
end
return -1
"#,
    )
});

/// Read a lock's state on one node.
///
/// - KEYS[1]: lock key, KEYS[2] (absent in compat mode): fencing counter
/// - Reply: `{value or false, pttl (-2 when absent), counter (0 without KEYS[2])}`.
pub(crate) static STATUS: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), KEYS[2] and tonumber(redis.call('GET', KEYS[2]) or '0') or 0}
"#,
    )
});

/// The resource-side fencing check for data kept in Redis: write only if the token is newer than
/// every token seen before.
///
/// Without a data key it is the claim (`fencing::fenced_claim`): the highest token seen is raised
/// to the claimer's and nothing is written, so that every later write or claim with a lower
/// token is refused.
///
/// - KEYS[1]: the resource's "highest token seen" key, KEYS[2] (absent for a claim): the data key
/// - ARGV[1]: the writer's token, ARGV[2]: the value to write
/// - Reply: `{1, token}` written or claimed (the token is at least the highest seen, so one
///   holder may write many times); `{0, highest}` rejected as stale, with the highest token seen.
pub(crate) static FENCED_WRITE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token < seen then
  return {0, seen}
end
redis.call('SET', KEYS[1], ARGV[1])
if KEYS[2] then
  redis.call('SET', KEYS[2], ARGV[2])
end
return {1, token}
"#,
    )
});

/// A fenced revoke (`Redlock::revoke`; `EVALSHA`, and `EVAL` with its body on `NOSCRIPT`: not
/// loaded on connect, since it runs rarely): raise the
/// node's fencing counter to the revoke's token (above the holder's), then delete the holder's
/// value if it stands here, leave a revoke marker holding that value for twice the key's
/// remaining time (its holder's failed extension reads it), and notify waiters as a release
/// does.
///
/// - KEYS[1]: lock key, KEYS[2]: fencing counter, KEYS[3]: waiters marker (also the channel),
///   KEYS[4]: revoke marker
/// - ARGV[1]: the value revoked, ARGV[2]: the revoke's token
/// - Reply: `1` deleted, `0` the key is absent, `-1` another value holds it (left alone). The
///   counter is raised in every case.
pub(crate) static REVOKE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(
        r#"
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
local v = redis.call('GET', KEYS[1])
if v ~= ARGV[1] then
  if v == false then
    return 0
  end
  return -1
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 1 then
  ttl = 60000
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[4], ARGV[1], 'PX', 2 * ttl)
local n = redis.call('SCARD', KEYS[3])
if n > 0 then
  redis.call('PUBLISH', KEYS[3], ARGV[1] .. ' ' .. n)
end
return 1
"#,
    )
});

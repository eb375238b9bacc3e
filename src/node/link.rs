//! One server's connection as the node layer holds it: over plain TCP or a Unix socket the
//! crate's own multiplexed connection (`wire.rs`, on the watched socket of `stream.rs`), over
//! `rediss://` redis-rs's multiplexer (its TLS layer owns the socket). Both take the same
//! calls, and both are a [`ConnectionLike`] for the commands built with redis-rs's API.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisConnectionInfo, RedisFuture, RedisResult, Value};

use super::resp::pack;
use super::scripts::ScriptCall;
use super::wire::Wire;

/// A connection to one server.
#[derive(Clone)]
pub(crate) enum Single {
    /// Plain TCP or a Unix socket: the crate's own connection, and the database it selected.
    Wire(Wire, i64),
    /// `rediss://`: redis-rs's multiplexed connection.
    Mux(MultiplexedConnection),
}

impl Single {
    /// Sends `cmd`; its reply (a server's error reply is a [`Value::ServerError`]).
    pub(crate) async fn send_packed_command(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Single::Wire(wire, _) => wire.one(&cmd.get_packed_command()).await,
            // Boxed: the TLS path's future stays out of the size of every call's future.
            Single::Mux(mux) => Box::pin(mux.send_packed_command(cmd)).await,
        }
    }

    /// Sends `call` as `EVALSHA` (or its plain command); its reply.
    pub(crate) async fn send_evalsha(&mut self, call: &ScriptCall) -> RedisResult<Value> {
        match self {
            Single::Wire(wire, _) => wire.one(call.evalsha_packed()).await,
            Single::Mux(mux) => Box::pin(mux.send_packed_command(call.evalsha())).await,
        }
    }

    /// Sends `call`'s pipelined fenced acquire; its two replies (`None`: the call has no
    /// pipelined form).
    pub(crate) async fn send_pipelined(
        &mut self,
        call: &ScriptCall,
    ) -> Option<RedisResult<Vec<Value>>> {
        Some(match self {
            Single::Wire(wire, _) => wire.many(call.pipelined_packed()?, 2).await,
            Single::Mux(mux) => Box::pin(mux.send_packed_commands(call.pipelined()?, 0, 2)).await,
        })
    }

    /// Sends the pipeline and returns `count` replies after the first `offset`.
    pub(crate) async fn send_packed_commands(
        &mut self,
        pipe: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        match self {
            Single::Wire(wire, _) => {
                let replies = wire
                    .many(&pipe.get_packed_pipeline(), offset + count)
                    .await?;
                Ok(after(replies, offset, pipe.is_transaction()))
            }
            Single::Mux(mux) => Box::pin(mux.send_packed_commands(pipe, offset, count)).await,
        }
    }
}

/// The replies a pipeline's caller wants: those after `offset`; a transaction's are the items
/// of its `EXEC` reply.
fn after(replies: Vec<Value>, offset: usize, transaction: bool) -> Vec<Value> {
    let mut rest = replies.into_iter().skip(offset);
    if transaction {
        return match rest.next() {
            Some(Value::Array(items)) => items,
            Some(other) => vec![other],
            None => Vec::new(),
        };
    }
    rest.collect()
}

impl ConnectionLike for Single {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send_packed_command(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.send_packed_commands(cmd, offset, count))
    }

    fn get_db(&self) -> i64 {
        match self {
            Single::Wire(_, db) => *db,
            Single::Mux(mux) => mux.get_db(),
        }
    }
}

/// A new connection's set-up, as the URL or the user's client asks, in one round trip:
/// `HELLO 3` (with `AUTH`) for RESP3, else `AUTH` when there is a password; `SELECT` for a
/// database other than 0; `CLIENT SETINFO` for a library name the user's client names (its
/// replies ignored: servers before Redis 7.2 refuse it). Nothing is sent when none applies. A
/// server that takes no user name (before Redis 6) is asked again with the password alone.
pub(crate) async fn handshake(wire: &Wire, info: &RedisConnectionInfo) -> RedisResult<()> {
    let mut out = Vec::new();
    let (auth, select) = (pack_auth(info, true, &mut out), info.db() != 0);
    if select {
        pack(&mut out, &[b"SELECT", info.db().to_string().as_bytes()]);
    }
    let named = library_name(info, &mut out);
    let count = usize::from(auth) + usize::from(select) + named;
    if count == 0 {
        return Ok(());
    }
    let mut replies = wire.many(&out, count).await?.into_iter();
    if auth {
        let reply = replies.next().unwrap_or(Value::Nil);
        if refused_user_name(&reply) && info.username().is_some() {
            let mut retry = Vec::new();
            if pack_auth(info, false, &mut retry) {
                check_auth(wire.one(&retry).await?)?;
            }
        } else {
            check_auth(reply)?;
        }
    }
    if select && let Some(Value::ServerError(e)) = replies.next() {
        return Err((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "Redis server refused to switch database",
            e.details().unwrap_or_default().to_owned(),
        )
            .into());
    }
    Ok(())
}

/// Packs `CLIENT SETINFO` for the library name (and version) a user's client was given with
/// `set_lib_name`, unless it skips them; how many commands it packed. A client that names no
/// library sends none: the lock's connections need no name.
fn library_name(info: &RedisConnectionInfo, out: &mut Vec<u8>) -> usize {
    let (Some(name), false) = (info.lib_name(), info.skip_set_lib_name()) else {
        return 0;
    };
    pack(out, &[b"CLIENT", b"SETINFO", b"LIB-NAME", name.as_bytes()]);
    match info.lib_ver() {
        Some(version) => {
            pack(
                out,
                &[b"CLIENT", b"SETINFO", b"LIB-VER", version.as_bytes()],
            );
            2
        }
        None => 1,
    }
}

/// Packs the authenticating command, `HELLO 3 [AUTH user password]` or `AUTH [user]
/// password` (the user left out without `with_user`); whether there is one.
fn pack_auth(info: &RedisConnectionInfo, with_user: bool, out: &mut Vec<u8>) -> bool {
    let password = info.password().map(str::as_bytes);
    if info.protocol().supports_resp3() {
        match password {
            Some(password) => {
                let user = info.username().unwrap_or("default").as_bytes();
                pack(out, &[b"HELLO", b"3", b"AUTH", user, password]);
            }
            None => pack(out, &[b"HELLO", b"3"]),
        }
        return true;
    }
    let Some(password) = password else {
        return false;
    };
    match info.username().filter(|_| with_user) {
        Some(user) => pack(out, &[b"AUTH", user.as_bytes(), password]),
        None => pack(out, &[b"AUTH", password]),
    }
    true
}

fn refused_user_name(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e)
        if e.details().is_some_and(|d| d.contains("wrong number of arguments for 'auth' command")))
}

fn check_auth(reply: Value) -> RedisResult<()> {
    match reply {
        Value::ServerError(_) => Err((
            redis::ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )
            .into()),
        _ => Ok(()),
    }
}

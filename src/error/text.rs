//! Errors from the `redis` crate and replies from a node, in words on one line: what a
//! message for people may carry of them. Nothing a node sends reaches a message raw: control
//! characters become spaces, runs of blanks one space.

use std::fmt;

use redis::{ErrorKind, RedisError, Value};

/// What a node that does not speak the Redis protocol is said to be.
pub(crate) const NOT_REDIS: &str = "not a Redis server (unexpected reply)";
/// A connection closed before the connect's first reply.
const NOT_REDIS_OR_CLOSED: &str =
    "not a Redis server, or one that closed the connection before its first reply";

/// What [`NodeError::NotRedis`](super::NodeError::NotRedis) says.
pub(crate) fn not_redis(closed_early: bool) -> &'static str {
    if closed_early {
        NOT_REDIS_OR_CLOSED
    } else {
        NOT_REDIS
    }
}

/// A `redis` error as one line of words: a server's error reply as Redis words it (`WRONGTYPE
/// Operation against a key ...`), an I/O error as the system words it (a failed name lookup
/// says DNS), a client-side error by its description, never the crate's debug names.
pub(crate) struct RedisText<'a>(pub(crate) &'a RedisError);

impl fmt::Display for RedisText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.0;
        let text = match e.kind() {
            ErrorKind::Parse | ErrorKind::UnexpectedReturnType => NOT_REDIS.to_owned(),
            ErrorKind::AuthenticationFailed => {
                "authentication failed: check the user name and password of the node URL".to_owned()
            }
            ErrorKind::Io => {
                let text = e.to_string();
                match text.strip_prefix("failed to lookup address information: ") {
                    Some(why) => format!("DNS lookup of the host failed: {why}"),
                    None => text,
                }
            }
            kind => match (e.code(), e.detail()) {
                (Some(code), Some(detail)) => format!("{code} {detail}"),
                (Some(code), None) => code.to_owned(),
                // A client-side error: its description, without the crate's `- Kind` suffix.
                _ => e.to_string().replace(&format!(" - {kind:?}"), ""),
            },
        };
        f.write_str(&one_line(&text))
    }
}

/// Why a node URL the `redis` crate refused is wrong, in words naming the part (`port 99999
/// is out of range (1-65535)`), or the crate's own reason when no part is found at fault.
pub(crate) struct UrlText<'a>(pub(crate) &'a str, pub(crate) &'a RedisError);

impl fmt::Display for UrlText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match url_problem(self.0) {
            Some(problem) => f.write_str(&one_line(&problem)),
            None => RedisText(self.1).fmt(f),
        }
    }
}

/// The schemes a node URL may have.
const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "unix",
    "redis+unix",
    "redis+cluster",
    "rediss+cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "valkey",
    "valkeys",
];

/// The part of `url` that is wrong: its scheme, its host's brackets, its port.
fn url_problem(url: &str) -> Option<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(
            "it has no scheme: write redis://host:port, rediss://host:port or unix:///path"
                .to_owned(),
        );
    };
    if !SCHEMES.contains(&scheme) {
        return Some(format!(
            "scheme {scheme:?} is not one of redis://, rediss://, unix://, redis+cluster://, \
             redis+sentinel://"
        ));
    }
    if scheme.contains("unix") {
        return None;
    }
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    for host_port in host_port.split(',') {
        let port = if let Some(v6) = host_port.strip_prefix('[') {
            let Some((_, after)) = v6.split_once(']') else {
                return Some(format!("IPv6 host {host_port:?} lacks its closing ]"));
            };
            after.strip_prefix(':')
        } else {
            host_port.split_once(':').map(|(_, p)| p)
        };
        match port {
            None | Some("") => {}
            Some(p) if !p.bytes().all(|b| b.is_ascii_digit()) => {
                return Some(format!("port {p:?} is not a number"));
            }
            Some(p) if p.parse::<u32>().map_or(true, |n| n > 65535) => {
                return Some(format!("port {p} is out of range (1-65535)"));
            }
            Some(_) => {}
        }
    }
    None
}

/// `text` with every control character (newlines, escapes) as a space and runs of blanks
/// collapsed: safe to print on one line of a terminal.
pub(crate) fn one_line(text: &str) -> String {
    let spaced: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    spaced.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A reply's kind in words (`an integer`, `an array of 2 replies`), for the message of a reply
/// with the wrong shape.
pub(crate) fn shape(v: &Value) -> String {
    match v {
        Value::Nil => "nil".to_owned(),
        Value::Int(_) => "an integer".to_owned(),
        Value::BulkString(_) => "a bulk string".to_owned(),
        Value::Array(items) => format!("an array of {} replies", items.len()),
        Value::SimpleString(_) => "a simple string".to_owned(),
        Value::Okay => "OK".to_owned(),
        Value::Map(items) => format!("a map of {} entries", items.len()),
        Value::Attribute { .. } => "an attribute".to_owned(),
        Value::Set(items) => format!("a set of {} replies", items.len()),
        Value::Double(_) => "a double".to_owned(),
        Value::Boolean(_) => "a boolean".to_owned(),
        Value::VerbatimString { .. } => "a verbatim string".to_owned(),
        Value::BigNumber(_) => "a big number".to_owned(),
        Value::Push { .. } => "a push message".to_owned(),
        Value::ServerError(e) => format!("the error {}", one_line(e.code())),
        _ => "a reply of an unknown type".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_errors_read_as_words_on_one_line() {
        let parse = redis::parse_redis_value(b"\xff\x00\r\n").unwrap_err();
        assert_eq!(RedisText(&parse).to_string(), NOT_REDIS);
        let io = RedisError::from(std::io::Error::other(
            "failed to lookup address information: Name or service not known",
        ));
        assert_eq!(
            RedisText(&io).to_string(),
            "DNS lookup of the host failed: Name or service not known"
        );
        let server = redis::parse_redis_value(b"-WRONGTYPE Operation against a key\r\n")
            .and_then(Value::extract_error)
            .unwrap_err();
        assert_eq!(
            RedisText(&server).to_string(),
            "WRONGTYPE Operation against a key"
        );
        let config = RedisError::from((ErrorKind::InvalidClientConfig, "Redis URL did not parse"));
        assert_eq!(RedisText(&config).to_string(), "Redis URL did not parse");
        assert_eq!(one_line("a\r\n\x1b[2Jb\tc"), "a [2Jb c");
        for (url, problem) in [
            (
                "redis://127.0.0.1:99999",
                "port 99999 is out of range (1-65535)",
            ),
            ("redis://u:p@h:abc/0", "port \"abc\" is not a number"),
            ("redis://[::1:5", "IPv6 host \"[::1:5\" lacks its closing ]"),
            ("127.0.0.1:6379", "it has no scheme"),
            ("http://h:1", "scheme \"http\" is not one of"),
        ] {
            let e = redis::Client::open(url).err();
            let e = e.unwrap_or_else(|| panic!("{url} parses"));
            let text = UrlText(url, &e).to_string();
            assert!(text.starts_with(problem), "{url}: {text}");
        }
    }
}

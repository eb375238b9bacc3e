//! RESP, as the crate's own connection (`wire.rs`) writes and reads it: commands packed as
//! arrays of bulk strings, and replies parsed in place. The usual reply shapes (`+OK`,
//! integers, bulk strings, nil, arrays of them) are built here; every other RESP2/RESP3 type is
//! measured here and built by redis-rs's parser. A frame that is not RESP, or nests deeper than
//! Redis's replies do, is refused, never followed.

use redis::Value;

/// A bad frame from the server.
#[derive(Debug)]
pub(crate) struct BadFrame;

/// How deep replies nest at most (Redis's own replies nest a few levels): deeper is taken for
/// a server that is not Redis, rather than followed down the stack.
const MAX_DEPTH: usize = 32;

/// One whole reply at the start of `buf` and the bytes it took; `None` when `buf` holds only
/// part of it.
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, BadFrame> {
    parse_at(buf, 0)
}

/// A frame's first line.
struct Header<'a> {
    /// The type byte.
    kind: u8,
    /// The rest of the line.
    line: &'a [u8],
    /// Where the line ends, its line end included.
    after: usize,
}

/// The first line of the frame at the start of `buf`; `None` when `buf` holds only part of it.
fn header(buf: &[u8], depth: usize) -> Result<Option<Header<'_>>, BadFrame> {
    if depth > MAX_DEPTH {
        return Err(BadFrame);
    }
    let (Some(&kind), Some(line_end)) = (buf.first(), find_crlf(buf)) else {
        return Ok(None);
    };
    Ok(Some(Header {
        kind,
        line: &buf[1..line_end],
        after: line_end + 2,
    }))
}

fn parse_at(buf: &[u8], depth: usize) -> Result<Option<(Value, usize)>, BadFrame> {
    let Some(Header { kind, line, after }) = header(buf, depth)? else {
        return Ok(None);
    };
    match kind {
        b'+' if line == b"OK" => Ok(Some((Value::Okay, after))),
        b':' => Ok(Some((Value::Int(int(line)?), after))),
        b'_' => Ok(Some((Value::Nil, after))),
        b'$' => {
            let n = int(line)?;
            if n < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            let Some(end) = sized_end(buf, after, n)? else {
                return Ok(None);
            };
            let bytes = buf[after..end - 2].to_vec();
            Ok(Some((Value::BulkString(bytes), end)))
        }
        b'*' => {
            let n = int(line)?;
            if n < 0 {
                return Ok(Some((Value::Nil, after)));
            }
            let n = usize::try_from(n).map_err(|_| BadFrame)?;
            let mut items = Vec::with_capacity(n.min(1024));
            let mut at = after;
            for _ in 0..n {
                let Some((v, used)) = parse_at(&buf[at..], depth + 1)? else {
                    return Ok(None);
                };
                items.push(v);
                at += used;
            }
            Ok(Some((Value::Array(items), at)))
        }
        _ => {
            let Some(len) = frame_len(buf, depth)? else {
                return Ok(None);
            };
            let value = redis::parse_redis_value(&buf[..len]).map_err(|_| BadFrame)?;
            Ok(Some((value, len)))
        }
    }
}

/// The length of the whole frame at the start of `buf`, of any RESP2/RESP3 type; `None` when
/// `buf` holds only part of it.
fn frame_len(buf: &[u8], depth: usize) -> Result<Option<usize>, BadFrame> {
    let Some(Header { kind, line, after }) = header(buf, depth)? else {
        return Ok(None);
    };
    let items = match kind {
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => return Ok(Some(after)),
        b'$' | b'!' | b'=' => return sized_end(buf, after, int(line)?),
        b'*' | b'~' | b'>' => int(line)?,
        b'%' | b'|' => int(line)?.saturating_mul(2),
        _ => return Err(BadFrame),
    };
    let mut at = after;
    for _ in 0..items.max(0) {
        let Some(used) = frame_len(&buf[at..], depth + 1)? else {
            return Ok(None);
        };
        at += used;
    }
    if kind == b'|' {
        // An attribute map precedes the value it describes.
        let Some(used) = frame_len(&buf[at..], depth + 1)? else {
            return Ok(None);
        };
        at += used;
    }
    Ok(Some(at))
}

/// Where a sized frame whose `n` bytes start at `after` ends, its closing line end included
/// (`n < 0`: a null, no body); `None` when `buf` holds only part of it.
fn sized_end(buf: &[u8], after: usize, n: i64) -> Result<Option<usize>, BadFrame> {
    if n < 0 {
        return Ok(Some(after));
    }
    let body_end = usize::try_from(n)
        .ok()
        .and_then(|n| n.checked_add(after))
        .ok_or(BadFrame)?;
    let end = body_end.checked_add(2).ok_or(BadFrame)?;
    match buf.get(body_end..end) {
        None => Ok(None),
        Some(b"\r\n") => Ok(Some(end)),
        Some(_) => Err(BadFrame),
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    let at = buf.iter().position(|&b| b == b'\r')?;
    (buf.get(at + 1)? == &b'\n').then_some(at)
}

/// Appends one command, its arguments in RESP, to `out` (grown once).
pub(crate) fn pack(out: &mut Vec<u8>, args: &[&[u8]]) {
    // `$<len>\r\n<arg>\r\n` per argument: at most 20 digits and 5 bytes of framing.
    out.reserve(25 + args.iter().map(|a| a.len() + 25).sum::<usize>());
    out.push(b'*');
    push_len(out, args.len());
    for arg in args {
        out.push(b'$');
        push_len(out, arg.len());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Appends `n` in decimal and a line end.
fn push_len(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn int(line: &[u8]) -> Result<i64, BadFrame> {
    let (neg, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(BadFrame);
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return Err(BadFrame);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(i64::from(d - b'0')))
            .ok_or(BadFrame)?;
    }
    Ok(if neg { -n } else { n })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames of every type, and what redis-rs's own parser makes of each.
    const FRAMES: [&[u8]; 14] = [
        b"+OK\r\n",
        b"+PONG\r\n",
        b"-ERR no\r\n",
        b":-42\r\n",
        b"$3\r\nabc\r\n",
        b"$-1\r\n",
        b"*-1\r\n",
        b"_\r\n",
        b"*3\r\n$-1\r\n:7\r\n*1\r\n+OK\r\n",
        b"#t\r\n",
        b",1.5\r\n",
        b"=8\r\ntxt:abcd\r\n",
        b"%1\r\n+a\r\n:1\r\n",
        b"|1\r\n+ttl\r\n:3\r\n:5\r\n",
    ];

    #[test]
    fn every_frame_parses_as_redis_rs_parses_it_and_no_prefix_is_taken_whole() {
        for frame in FRAMES {
            let text = String::from_utf8_lossy(frame);
            let (value, used) = parse(frame).unwrap().unwrap();
            assert_eq!(used, frame.len(), "{text}");
            assert_eq!(value, redis::parse_redis_value(frame).unwrap(), "{text}");
            for cut in 0..frame.len() {
                assert!(
                    parse(&frame[..cut]).unwrap().is_none(),
                    "{text} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn bad_frames_are_refused_not_followed() {
        let deep = [b"*1\r\n".repeat(5000), b":1\r\n".to_vec()].concat();
        for bad in [
            &deep[..],
            b"SSH-2.0-OpenSSH\r\n",
            b":x\r\n",
            b"$1\r\nab\r\n",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn pack_writes_what_redis_rs_writes() {
        let mut out = Vec::new();
        let long = vec![b'v'; 12_345];
        pack(
            &mut out,
            &[b"SET", b"k", b"", b"PX", b"10000", &[b'w'; 42], &long],
        );
        let mut cmd = redis::cmd("SET");
        cmd.arg("k")
            .arg("")
            .arg("PX")
            .arg(10_000)
            .arg(&[b'w'; 42])
            .arg(&long);
        assert_eq!(out, cmd.get_packed_command());
    }
}

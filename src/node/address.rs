//! Node addresses: the display name of a parsed address and the redaction of URLs that could
//! not be parsed. Passwords never reach a log line, an error or a metric label.

/// A node's display name from its parsed address: scheme, user, host and port (or socket path)
/// and db, never the password.
pub(crate) fn node_name(info: &redis::ConnectionInfo) -> String {
    let settings = info.redis_settings();
    let user = settings
        .username()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = settings.db();
    match info.addr() {
        redis::ConnectionAddr::Unix(path) if db != 0 => {
            format!("unix://{}?db={db}", path.display())
        }
        redis::ConnectionAddr::Unix(path) => format!("unix://{}", path.display()),
        addr => {
            let scheme = if matches!(addr, redis::ConnectionAddr::TcpTls { .. }) {
                "rediss"
            } else {
                "redis"
            };
            let db = if db != 0 {
                format!("/{db}")
            } else {
                String::new()
            };
            format!("{scheme}://{user}{addr}{db}")
        }
    }
}

/// A URL with its password replaced by `***` (in the authority and in `pass=` / `password=`
/// query parameters), for URLs that could not be parsed.
pub(crate) fn redact(url: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut out = redact_authority(base);
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if k == "pass" || k == "password" => format!("{k}=***"),
                _ => p.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&params.join("&"));
    }
    out
}

fn redact_authority(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    let userinfo = &rest[..at];
    let user = userinfo.split_once(':').map_or("", |(u, _)| u);
    format!("{}{}:***@{}", &url[..scheme_end + 3], user, &rest[at + 1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redact_hides_passwords_only() {
        assert_eq!(redact("redis://127.0.0.1:7001"), "redis://127.0.0.1:7001");
        assert_eq!(
            redact("redis://user:secret@h:1/2"),
            "redis://user:***@h:1/2"
        );
        assert_eq!(redact("rediss://:secret@h:1"), "rediss://:***@h:1");
        assert_eq!(redact("unix:///tmp/r.sock"), "unix:///tmp/r.sock");
        assert_eq!(
            redact("unix:///tmp/r.sock?db=2&pass=secret"),
            "unix:///tmp/r.sock?db=2&pass=***"
        );
    }

    #[test]
    fn node_names_never_carry_the_password() {
        for (url, name) in [
            ("redis://127.0.0.1:7001", "redis://127.0.0.1:7001"),
            ("redis://u:pw@h:1/3", "redis://u@h:1/3"),
            ("redis://:pw@h:1", "redis://h:1"),
            ("unix:///tmp/r.sock?pass=pw&db=2", "unix:///tmp/r.sock?db=2"),
        ] {
            let client = redis::Client::open(url).unwrap();
            assert_eq!(node_name(client.get_connection_info()), name, "{url}");
        }
    }
}

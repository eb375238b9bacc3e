//! The unit tests of the `redlock` binary's root: exit codes, messages, argument parsing.

use super::*;

use clap::CommandFactory;

#[test]
fn the_argument_definitions_are_consistent() {
    Cli::command().debug_assert();
    command().debug_assert();
}

#[test]
fn exit_codes_follow_the_contract() {
    let held = Error::Held {
        key: "k".into(),
        held: 3,
        nodes: 5,
        needed: 3,
    };
    assert_eq!(exit_code(&held), 75);
    let no_quorum = Error::NoQuorum {
        key: "k".into(),
        reached: 2,
        nodes: 5,
        needed: 3,
        failures: vec![],
    };
    assert_eq!(exit_code(&no_quorum), 69);
    let lost = Error::Lost {
        key: "k".into(),
        reason: quorumlock::LostReason::Expired,
    };
    assert_eq!(exit_code(&lost), 79);
    assert_eq!(exit_code(&Error::Config(ConfigError::NoNodes)), 64);
    let too_long = ConfigError::TooLong {
        name: quorumlock::Setting::NodeTimeout,
        value: Duration::from_secs(7200),
        max: Duration::from_secs(3600),
    };
    assert_eq!(exit_code(&Error::Config(too_long)), 64);
    let ttl = quorumlock::ArgumentError::TtlTooLong(Duration::from_secs(100 * 86400));
    assert_eq!(exit_code(&Error::InvalidArgument(ttl)), 64);
    let slow = Error::ValidityExpired {
        key: "k".into(),
        elapsed: Duration::from_millis(1200),
        ttl: Duration::from_secs(1),
    };
    assert_eq!(exit_code(&slow), 69);
}

#[test]
fn the_conflict_code_replaces_only_held() {
    let held = Error::Held {
        key: "k".into(),
        held: 3,
        nodes: 5,
        needed: 3,
    };
    assert_eq!(conflict_exit_code(&held, 3), 3);
    assert_eq!(conflict_exit_code(&held, 0), 0);
    let no_quorum = Error::NoQuorum {
        key: "k".into(),
        reached: 2,
        nodes: 5,
        needed: 3,
        failures: vec![],
    };
    assert_eq!(conflict_exit_code(&no_quorum, 3), 69);
    assert_eq!(
        conflict_exit_code(&Error::Config(ConfigError::NoNodes), 3),
        64
    );
}

#[test]
fn a_slow_quorum_says_what_happened() {
    let slow = Error::ValidityExpired {
        key: "job".into(),
        elapsed: Duration::from_micros(1_204_567),
        ttl: Duration::from_secs(1),
    };
    assert_eq!(
        describe(&slow),
        "the nodes answered too slowly for a quorum on \"job\": a quorum agreed only after \
         1s 204ms of the 1s ttl, which left no validity (check the nodes and the network, or \
         use a longer --ttl)"
    );
    assert!(describe(&Error::Config(ConfigError::NoNodes)).ends_with("or REDLOCK_NODES)"));
    assert!(describe(&Error::Config(ConfigError::FencingRequired)).starts_with("--compat"));
}

#[test]
fn every_duration_option_is_bounded() {
    let ttl = duration_up_to(MAX_TTL, MAX_TTL_TEXT);
    assert_eq!(ttl("49days"), Ok(Duration::from_secs(49 * 86400)));
    assert_eq!(ttl("4294967295ms"), Ok(MAX_TTL));
    assert_eq!(
        ttl("50days").unwrap_err(),
        "too long: at most 4294967295ms, about 49.7 days"
    );
    assert!(ttl("300000000000y").is_err());
    // Each limit's text parses back to the limit.
    for (max, text) in [
        (MAX_NODE_TIMEOUT, "1h"),
        (MAX_WAIT, "365days"),
        (MAX_KILL_AFTER, "1day"),
        (MAX_PERIOD, MAX_PERIOD_TEXT),
    ] {
        assert_eq!(humantime::parse_duration(text), Ok(max));
        let parse = duration_up_to(max, text);
        assert_eq!(parse(text), Ok(max));
        assert!(parse(&format!("{text} 1ms")).is_err());
    }
    assert!(duration_up_to(MAX_WAIT, "365days")("soon").is_err());
}

//! The lock value: what identifies one acquisition on the nodes (only its holder can extend or
//! release the lock), the time it was made, and the owner name it carries. Pure but for
//! [`new_value`], which reads the wall clock ([`super::clock::wall_ms`]) and draws random bits.
//!
//! A value is `<32 lowercase hex digits>`, then `@<owner>` when the client set a name
//! ([`owner_suffix`]). The hex digits are a UUIDv7 (RFC 9562, section 5.7):
//!
//! | bits | what |
//! | --- | --- |
//! | 48 | the wall-clock time the value was made, in ms since the Unix epoch |
//! | 4 | the version, `7` |
//! | 12 | random |
//! | 2 | the variant, `0b10` |
//! | 62 | random |
//!
//! Every ownership check compares the whole value as an opaque string: nothing but the
//! inventory ([`acquired_at_of`]) and the owner's name ([`owner_of`]) reads inside it, so a value
//! handed to another process is resumed as it is, and other Redlock clients' values (compat
//! mode) work alike.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{ArgumentError, ConfigError};

/// A fresh owner value, as 32 lowercase hex digits: what identifies one acquisition on the
/// nodes (only its owner can extend or release it). Its 128 bits are laid out as a UUIDv7
/// (RFC 9562, section 5.7): the wall-clock time it was made, in ms since the Unix epoch (48
/// bits), the version `7` (4 bits), 12 random bits, the variant `0b10` (2 bits), 62 random bits.
/// The 74 random bits keep values unique: two values collide only when made in the same
/// millisecond with the same random bits, about `n² / 2⁷⁵` for `n` values made in one
/// millisecond. [`acquired_at_of`] reads the time back.
pub(crate) fn new_value() -> String {
    new_value_of("")
}

/// Appends `bits` as 32 lowercase hex digits, most significant first (what `{:032x}` writes,
/// without the formatter: a value is made on every acquisition).
fn push_hex(out: &mut String, bits: u128) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Two digits per byte into a buffer, appended at once (not a digit at a time).
    let mut hex = [0u8; 32];
    for (pair, byte) in hex.chunks_exact_mut(2).zip(bits.to_be_bytes()) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xF)];
    }
    // The digits are ASCII: never the empty default.
    out.push_str(std::str::from_utf8(&hex).unwrap_or_default());
}

/// The bits of a value made at `unix_ms` from `random` (pure; see [`new_value`]): the time's
/// low 48 bits, then the version, variant and 74 of `random`'s bits.
fn dated_bits(unix_ms: u64, random: u128) -> u128 {
    let time = u128::from(unix_ms & TIME_MASK) << 80;
    (random & RANDOM_MASK) | time | VERSION_BITS | VARIANT_BITS
}

/// The 48 bits of a millisecond time stamp.
const TIME_MASK: u64 = (1 << 48) - 1;
/// Where a value holds random bits: every bit but the time, version and variant.
const RANDOM_MASK: u128 = !((u128::MAX << 80) | (0xF << 76) | (0b11 << 62));
/// UUID version 7 (a Unix time stamp in ms).
const VERSION_BITS: u128 = 0x7 << 76;
/// The RFC 9562 variant (`0b10`).
const VARIANT_BITS: u128 = 0b10 << 62;

/// The earliest acquisition time [`acquired_at_of`] accepts (2025-01-01T00:00:00Z, in ms since
/// the Unix epoch): no value of this form was made before it, so an earlier time marks a value
/// of another client (a random value read as a time).
pub(crate) const DATED_SINCE_MS: u64 = 1_735_689_600_000;

/// How far ahead of the reader's clock an acquisition time may be (the acquiring host's clock
/// running ahead): further ahead, the value is taken for another client's.
pub(crate) const MAX_AHEAD: Duration = Duration::from_secs(24 * 3600);

/// When the value was made, as the acquiring host's wall clock read it (ms precision): `Some`
/// for a value of this crate's form (`<32 lowercase hex digits>`, optionally followed by
/// `@<owner>`) whose digits carry the UUIDv7 version and variant (see [`new_value`]) and a time
/// from [`DATED_SINCE_MS`] to `now` plus [`MAX_AHEAD`]; `None` otherwise (a value of another
/// Redlock client, or one without a time stamp), rather than a time read from random bits.
///
/// A random 128-bit value of another client passes these checks with a probability of `2⁻⁶`
/// (version and variant) times the window's share of the 48-bit time range (about `1.1 × 10⁻⁴`
/// per year since 2025): below `2 × 10⁻⁶` per year the window spans.
pub(crate) fn acquired_at_of(value: &str, now: SystemTime) -> Option<SystemTime> {
    let (digits, rest) = value.split_at_checked(32)?;
    if !(rest.is_empty() || rest.len() > 1 && rest.starts_with(OWNER_SEPARATOR))
        || !digits
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let bits = u128::from_str_radix(digits, 16).ok()?;
    if bits & (0xF << 76) != VERSION_BITS || bits & (0b11 << 62) != VARIANT_BITS {
        return None;
    }
    let ms = u64::try_from(bits >> 80).ok()?;
    if ms < DATED_SINCE_MS {
        return None;
    }
    let at = UNIX_EPOCH.checked_add(Duration::from_millis(ms))?;
    (at <= now.checked_add(MAX_AHEAD)?).then_some(at)
}

/// A fresh lock value: a [`new_value`] (32 hex digits), then `owner` (an [`owner_suffix`], or
/// empty). The hex digits alone make the value unique; the suffix only names who holds it.
pub(crate) fn new_value_of(owner: &str) -> String {
    let mut value = String::with_capacity(32 + owner.len());
    push_hex(
        &mut value,
        dated_bits(super::clock::wall_ms(), rand::random::<u128>()),
    );
    value.push_str(owner);
    value
}

/// What separates a lock value's random part from its owner's name (`<32 hex>@<owner>`).
pub(crate) const OWNER_SEPARATOR: char = '@';

/// The longest owner name accepted, in bytes (before escaping).
pub(crate) const MAX_OWNER_LEN: usize = 128;

/// The longest lock value [`check_value`] accepts, in bytes.
pub(crate) const MAX_VALUE_LEN: usize = 1024;

/// Checks an owner name and returns what this client's lock values carry after their random
/// part: `@` and the name, with `%` and the space escaped (`%25`, `%20`), so that a value never
/// holds a space (release notices are `"<value> <waiting clients>"`, leader records
/// `"<value> <token> <candidate>"`). 1 to [`MAX_OWNER_LEN`] bytes, no control characters.
pub(crate) fn owner_suffix(owner: &str) -> Result<String, ConfigError> {
    let reason = if owner.is_empty() {
        "it is empty"
    } else if owner.len() > MAX_OWNER_LEN {
        "it is longer than 128 bytes"
    } else if owner.chars().any(char::is_control) {
        "it holds a control character (a line break, a tab...)"
    } else {
        let mut suffix = String::with_capacity(1 + owner.len() + 8);
        suffix.push(OWNER_SEPARATOR);
        for c in owner.chars() {
            match c {
                '%' => suffix.push_str("%25"),
                ' ' => suffix.push_str("%20"),
                c => suffix.push(c),
            }
        }
        return Ok(suffix);
    };
    Err(ConfigError::InvalidOwner {
        owner: owner.to_owned(),
        reason,
    })
}

/// The owner name a lock value carries: `Some` for a value of this crate's form
/// `<32 lowercase hex digits>@<escaped name>` (see [`owner_suffix`]), unescaped; `None` for a
/// value without one (a client with no owner set, another Redlock client's value).
pub(crate) fn owner_of(value: &str) -> Option<String> {
    let (random, rest) = value.split_at_checked(32)?;
    let name = rest.strip_prefix(OWNER_SEPARATOR)?;
    if name.is_empty()
        || !random
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = &rest[at..];
        if let Some(after) = escape.strip_prefix("%20") {
            out.push(' ');
            rest = after;
        } else if let Some(after) = escape.strip_prefix("%25") {
            out.push('%');
            rest = after;
        } else {
            out.push('%');
            rest = &escape[1..];
        }
    }
    out.push_str(rest);
    Some(out)
}

/// Checks a lock value given back to the library (to resume a lock handed over by another
/// process): not empty, at most [`MAX_VALUE_LEN`] bytes, no space and no control character
/// (no value this crate writes has either).
pub(crate) fn check_value(value: &str) -> Result<(), ArgumentError> {
    let reason = if value.is_empty() {
        "it is empty"
    } else if value.len() > MAX_VALUE_LEN {
        "it is longer than 1024 bytes"
    } else if value.chars().any(|c| c == ' ' || c.is_control()) {
        "it holds a space or a control character"
    } else {
        return Ok(());
    };
    Err(ArgumentError::InvalidValue { reason })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn hex_digits_are_the_formatters(bits in any::<u128>()) {
            let mut out = String::new();
            push_hex(&mut out, bits);
            prop_assert_eq!(out, format!("{bits:032x}"));
        }
    }

    #[test]
    fn owner_names_are_carried_escaped_and_read_back() {
        for name in [
            "host-a/pid 4711",
            "100% sure",
            "worker@host",
            "é ü",
            "%20",
            "a",
        ] {
            let suffix = owner_suffix(name).unwrap();
            assert!(!suffix.contains(' '), "{suffix}");
            let value = new_value_of(&suffix);
            assert_eq!(owner_of(&value).as_deref(), Some(name), "{value}");
            assert!(check_value(&value).is_ok(), "{value}");
        }
        assert_eq!(
            owner_suffix("host-a/pid 4711").unwrap(),
            "@host-a/pid%204711"
        );
        assert_eq!(owner_of(&new_value()), None);
        assert_eq!(owner_of(&new_value_of("")), None);
        assert_eq!(owner_of("not-hex-not-hex-not-hex-not-hex-@x"), None);
        assert_eq!(owner_of("short@x"), None);
        for bad in ["", "a\nb", "tab\there", &"x".repeat(129)] {
            assert!(
                matches!(owner_suffix(bad), Err(ConfigError::InvalidOwner { .. })),
                "{bad:?}"
            );
        }
        assert!(owner_suffix(&"x".repeat(128)).is_ok());
    }

    proptest! {
        #[test]
        fn any_accepted_owner_round_trips(name in "\\PC{1,40}") {
            if let Ok(suffix) = owner_suffix(&name) {
                let value = new_value_of(&suffix);
                prop_assert!(!value.contains(' '));
                prop_assert_eq!(owner_of(&value), Some(name));
            }
        }
    }

    /// 2026-06-01T00:00:00Z, in ms since the Unix epoch.
    const JUNE_2026: u64 = 1_780_272_000_000;

    fn at_ms(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn a_value_carries_the_time_it_was_made() {
        let before = SystemTime::now();
        let value = new_value_of("@host-a");
        let after = SystemTime::now();
        let at = acquired_at_of(&value, after).expect("a value of this crate is dated");
        // Milliseconds: the stamp is the time made, rounded down to a millisecond.
        assert!(
            at + Duration::from_millis(1) > before && at <= after,
            "{value}"
        );
        assert_eq!(acquired_at_of(&new_value(), after).map(|_| ()), Some(()));
        // The UUIDv7 version and variant digits.
        assert_eq!(&value[12..13], "7", "{value}");
        assert!(matches!(&value[16..17], "8" | "9" | "a" | "b"), "{value}");
    }

    #[test]
    fn values_of_other_clients_have_no_time() {
        let now = at_ms(JUNE_2026);
        let dated = format!("{:032x}", dated_bits(JUNE_2026 - 5_000, 0));
        assert_eq!(acquired_at_of(&dated, now), Some(at_ms(JUNE_2026 - 5_000)));
        let with_owner = format!("{dated}@worker");
        assert_eq!(
            acquired_at_of(&with_owner, now),
            Some(at_ms(JUNE_2026 - 5_000))
        );
        let one_day = MAX_AHEAD.as_millis() as u64;
        for foreign in [
            // node-redlock, redsync, rslock: random hex, not a UUIDv7.
            "0123456789abcdef0123456789abcdef".to_owned(),
            "fedcba9876543210fedcba9876543210".to_owned(),
            // The version digit without the variant.
            "0192a0b1c2d37e4f0123456789abcdef".to_owned(),
            // pottery: a UUIDv4 with hyphens; Redisson: a UUID and a thread id.
            "8a4f3e1c-2b7d-4c9e-a1f0-3d5e7b9c1a2f".to_owned(),
            "8a4f3e1c-2b7d-4c9e-a1f0-3d5e7b9c1a2f:1".to_owned(),
            // A UUIDv7 read as a time before any value of this form was made, or ahead.
            format!("{:032x}", dated_bits(DATED_SINCE_MS - 1, 0)),
            format!("{:032x}", dated_bits(JUNE_2026 + one_day + 1, 0)),
            // Upper-case digits, trailing text other than an owner, too short.
            dated.to_uppercase(),
            format!("{dated}x"),
            format!("{dated}@"),
            dated[..31].to_owned(),
            String::new(),
        ] {
            assert_eq!(acquired_at_of(&foreign, now), None, "{foreign}");
        }
        // A host's clock ahead of the reader's, within the allowance: read as it is.
        let ahead = format!("{:032x}", dated_bits(JUNE_2026 + one_day, 0));
        assert_eq!(
            acquired_at_of(&ahead, now),
            Some(at_ms(JUNE_2026 + one_day))
        );
    }

    proptest! {
        #[test]
        fn values_are_valid_distinct_and_read_back(
            ms in DATED_SINCE_MS..(1u64 << 48),
            random: u128,
            other: u128,
            name in "[a-z0-9/ ]{1,20}",
        ) {
            let suffix = owner_suffix(&name).unwrap();
            let value = format!("{:032x}{suffix}", dated_bits(ms, random));
            prop_assert!(check_value(&value).is_ok());
            prop_assert_eq!(owner_of(&value), Some(name));
            prop_assert_eq!(acquired_at_of(&value, at_ms(ms)), Some(at_ms(ms)));
            // Only the random bits tell two values of one millisecond apart: values made from
            // random bits that differ there differ.
            let (a, b) = (dated_bits(ms, random), dated_bits(ms, other));
            prop_assert_eq!(a == b, random & RANDOM_MASK == other & RANDOM_MASK);
            prop_assert_eq!(RANDOM_MASK.count_ones(), 74);
        }

        #[test]
        fn a_random_value_read_as_a_time_is_within_the_window(
            random: u128,
            uuid_v7_marks: bool,
            now in DATED_SINCE_MS..(1u64 << 47),
        ) {
            // What a foreign value may be read as: never before the window nor past now plus
            // the allowance, and only with the version and variant of a UUIDv7.
            let marks = (0xF << 76) | (0b11 << 62);
            let random = if uuid_v7_marks {
                (random & !marks) | VERSION_BITS | VARIANT_BITS
            } else {
                random
            };
            let value = format!("{random:032x}");
            if let Some(at) = acquired_at_of(&value, at_ms(now)) {
                prop_assert!(at >= at_ms(DATED_SINCE_MS));
                prop_assert!(at <= at_ms(now) + MAX_AHEAD);
                prop_assert_eq!(random & marks, VERSION_BITS | VARIANT_BITS);
            }
        }
    }

    #[test]
    fn values_given_back_are_checked() {
        assert!(check_value(&new_value()).is_ok());
        for bad in ["", "a b", "a\nb", &"x".repeat(1025)] {
            assert!(check_value(bad).is_err(), "{bad:?}");
        }
    }
}

//! The leader record and the election's keys: the one place that writes and reads the record's
//! format, `"<lock value> <token> <candidate id>"`.
//!
//! The record is written by a new leader on every node where its own lock value stands (a
//! script checks the value and sets the record in one step), read by
//! [`Observer::leader`](super::Observer::leader), and deleted (only if still exactly ours) by a
//! resign.
//! The engine sends them (`Engine::write_leader_record`, `read_leader_record`,
//! `resign_leader`, `publish_everywhere`).

use crate::client::Engine;
use crate::client::side::Replies;
use crate::core::keys::KeyLayout;
use crate::core::token::FencingToken;

/// The keys of one election, all in the lock's hash slot: the lock `quorumlock:{NAME}`, the
/// leader record `quorumlock:{NAME}:leader` and the notice channel `quorumlock:{NAME}:events`
/// (under the client's key prefix).
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub(crate) lock: String,
    pub(crate) record: String,
    pub(crate) channel: String,
}

impl Keys {
    pub(crate) fn new(layout: &KeyLayout, name: &str) -> Self {
        let lock = layout.lock_key(name);
        Keys {
            record: format!("{lock}:leader"),
            channel: format!("{lock}:events"),
            lock,
        }
    }

    /// Writes `record` where our lock value stands (reply 1 there, 0 elsewhere), to a quorum.
    pub(crate) async fn write(&self, engine: &Engine, record: &Record) -> Replies<i64> {
        let encoded = record.encode();
        engine
            .write_leader_record(&self.lock, &self.record, &record.value, &encoded)
            .await
    }

    /// Reads the record on every node.
    pub(crate) async fn read(&self, engine: &Engine) -> Replies<Option<String>> {
        engine.read_leader_record(&self.record).await
    }

    /// Deletes `record` if it is still there, then publishes `message` (reply: subscribers
    /// reached), to a quorum.
    pub(crate) async fn resign(
        &self,
        engine: &Engine,
        record: Option<&Record>,
        message: &str,
    ) -> Replies<i64> {
        let ours = record.map(Record::encode).unwrap_or_default();
        engine
            .resign_leader(&self.record, &ours, &self.channel, message)
            .await
    }

    /// Publishes `message` on the channel (reply: subscribers reached), to a quorum.
    pub(crate) async fn publish(&self, engine: &Engine, message: &str) -> Replies<i64> {
        engine.publish_everywhere(&self.channel, message).await
    }
}

/// A leader record: the term's lock value (random per acquisition, so the record names the
/// leader of exactly one term), its token and the leader's candidate id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) value: String,
    pub(crate) token: FencingToken,
    pub(crate) candidate: String,
}

impl Record {
    /// `"<lock value> <token> <candidate id>"` (the id may hold spaces; the value never does).
    pub(crate) fn encode(&self) -> String {
        format!("{} {} {}", self.value, self.token, self.candidate)
    }

    pub(crate) fn parse(text: &str) -> Option<Record> {
        let mut parts = text.splitn(3, ' ');
        let value = parts.next()?.to_owned();
        let token = FencingToken::new(parts.next()?.parse().ok()?);
        let candidate = parts.next().unwrap_or_default().to_owned();
        Some(Record {
            value,
            token,
            candidate,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_keep_spaces_in_ids() {
        let r = Record {
            value: "v1".to_owned(),
            token: FencingToken::new(8),
            candidate: "host b".to_owned(),
        };
        assert_eq!(r.encode(), "v1 8 host b");
        assert_eq!(Record::parse(&r.encode()), Some(r));
        assert_eq!(Record::parse("v1 x host"), None);
        assert_eq!(Record::parse("v1"), None);
    }

    /// A lock value that carries an owner name (spaces escaped) keeps the record's three
    /// fields apart.
    #[test]
    fn records_of_owner_named_values_round_trip() {
        let suffix = crate::core::value::owner_suffix("host-a/pid 4711").unwrap();
        let r = Record {
            value: crate::core::value::new_value_of(&suffix),
            token: FencingToken::new(3),
            candidate: "scheduler 0".to_owned(),
        };
        assert_eq!(Record::parse(&r.encode()), Some(r.clone()));
        assert_eq!(
            crate::core::value::owner_of(&r.value).as_deref(),
            Some("host-a/pid 4711")
        );
    }

    #[test]
    fn keys_share_the_lock_hash_slot() {
        let k = Keys::new(&KeyLayout::default(), "e");
        assert_eq!(k.lock, "quorumlock:{e}");
        assert_eq!(k.record, "quorumlock:{e}:leader");
        assert_eq!(k.channel, "quorumlock:{e}:events");
    }
}

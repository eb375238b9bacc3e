//! The inventory of held locks: [`Redlock::locks`](crate::Redlock::locks), [`Inventory`], [`HeldLock`]. Each node is
//! scanned page by page (`node/inventory.rs`), the pages merged by key, and a key listed only
//! where its value stands on a quorum (or could, counting the nodes that did not answer).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::Engine;
use crate::core::quorum::{self, HolderView};
use crate::core::token::FencingToken;
use crate::core::value;
use crate::error::{ConfigError, Error, NodeError, NodeFailure};
use crate::node::inventory::Found;

/// One node's answer for one key: its value, `PTTL` and fencing counter.
type Answer = (String, i64, u64);

/// Keys asked of a node per `SCAN` page.
const PAGE: usize = 1000;

/// The most lock keys read from one node: past it the scan stops and the inventory says it is
/// [`truncated`](Inventory::truncated) (the memory bound: a few hundred bytes per key and node).
pub const MAX_LOCKS: usize = 100_000;

/// One held lock, from [`Redlock::locks`](crate::Redlock::locks).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The user key.
    pub key: String,
    /// The holder's value (bytes that are not UTF-8, as another client may write, replaced by
    /// `U+FFFD`, as [`Redlock::status`](crate::Redlock::status) shows them).
    pub value: String,
    /// The owner name that value carries, if its client set one.
    pub owner: Option<String>,
    /// How many nodes hold the value.
    pub held_on: usize,
    /// `true` when the value stands on a quorum of the nodes that answered; `false` when it
    /// stands on fewer but the nodes that did not answer could complete a quorum (it may be
    /// held).
    pub certain: bool,
    /// The time left until fewer than a quorum hold it (the quorum-th longest remaining time
    /// among the nodes that hold it); `None` when fewer than a quorum answered with it.
    pub ttl: Option<Duration>,
    /// The highest fencing counter of the key's slot among the nodes that hold it: at or above
    /// the holder's token.
    pub fence: FencingToken,
    /// When the holder acquired the lock, as the acquiring host's wall clock read it, to the
    /// millisecond: the value records it (its hex digits are a UUIDv7, see [`Lock::value`]).
    /// Extensions do not change it, and a lock handed over ([`Redlock::resume`](crate::Redlock::resume)) keeps the
    /// time of its acquisition. Clock skew between that host and the reader applies as it is.
    /// `None` when the value has no trustworthy time: a value of another Redlock client
    /// (random bits, which would read as a random date), or one whose time falls outside the
    /// plausible window (before 2025, or more than a day ahead of the reader's clock).
    ///
    /// [`Lock::value`]: crate::Lock::value
    pub acquired_at: Option<SystemTime>,
}

impl HeldLock {
    /// How long ago the lock was acquired, by `now` (the reader's wall clock, as
    /// [`SystemTime::now`]): `None` when [`acquired_at`](Self::acquired_at) is unknown; zero
    /// when the acquiring host's clock is ahead of `now`.
    ///
    /// ```no_run
    /// # async fn demo(locks: &quorumlock::Redlock) -> Result<(), quorumlock::Error> {
    /// use std::time::{Duration, SystemTime};
    ///
    /// let now = SystemTime::now();
    /// for lock in locks.locks("").await?.locks {
    ///     if lock.age(now).is_some_and(|age| age > Duration::from_secs(3600)) {
    ///         println!("{} has been held for over an hour by {}", lock.key, lock.value);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn age(&self, now: SystemTime) -> Option<Duration> {
        self.acquired_at
            .map(|at| now.duration_since(at).unwrap_or(Duration::ZERO))
    }
}

/// Every lock held under a prefix, from [`Redlock::locks`](crate::Redlock::locks).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Inventory {
    /// The locks, sorted by key.
    pub locks: Vec<HeldLock>,
    /// The configured number of nodes.
    pub nodes: usize,
    /// The quorum.
    pub quorum: usize,
    /// The nodes that could not be scanned to the end, and why (left out of every count).
    pub failures: Vec<NodeFailure>,
    /// Some node held more than [`MAX_LOCKS`] lock keys under the prefix: the list is partial.
    pub truncated: bool,
}

impl Engine {
    /// The engine side of [`Redlock::locks`](crate::Redlock::locks).
    pub(crate) async fn locks(&self, prefix: &str) -> Result<Inventory, Error> {
        let (client, prefix) = (self.clone(), prefix.to_owned());
        self.on_io_thread(async move { client.locks_inline(&prefix).await })
            .await
    }

    async fn locks_inline(&self, prefix: &str) -> Result<Inventory, Error> {
        // In compat mode a lock key is the user's key itself: nothing tells it from others.
        if self.keys().is_compat() {
            return Err(ConfigError::FencingRequired.into());
        }
        let layout = self.keys().clone();
        let glob = layout.lock_glob(prefix);
        let timeout = self.inner.cfg.node_timeout.max(Duration::from_secs(1));
        let scans = self.inner.nodes.iter().map(|node| {
            let (layout, glob) = (&layout, &glob);
            async move {
                let mut found: Vec<Found> = Vec::new();
                let mut cursor = 0;
                loop {
                    let (next, page) = node
                        .lock_keys_page(layout, glob, cursor, PAGE, timeout)
                        .await?;
                    found.extend(page);
                    if found.len() > MAX_LOCKS {
                        found.truncate(MAX_LOCKS);
                        return Ok::<_, NodeError>((found, true));
                    }
                    if next == 0 {
                        return Ok((found, false));
                    }
                    cursor = next;
                }
            }
        });
        let started = Instant::now();
        let scanned = futures::future::join_all(scans).await;
        tracing::debug!(prefix, took = ?started.elapsed(), "inventory scanned");
        let n = self.node_count();
        let q = self.quorum();
        let mut failures = Vec::new();
        let mut truncated = false;
        // Per key, each node's answer: (value, pttl, fence).
        let mut by_key: BTreeMap<String, Vec<Option<Answer>>> = BTreeMap::new();
        let mut answered = 0;
        for (i, (node, scan)) in self.inner.nodes.iter().zip(scanned).enumerate() {
            match scan {
                Ok((found, cut)) => {
                    answered += 1;
                    truncated |= cut;
                    for f in found {
                        let Some(value) = f.value else { continue };
                        by_key.entry(f.key).or_insert_with(|| vec![None; n])[i] =
                            Some((value, f.pttl, f.fence));
                    }
                }
                Err(cause) => failures.push(NodeFailure {
                    node: node.name().to_owned(),
                    cause,
                }),
            }
        }
        if answered < q {
            return Err(Error::NoQuorum {
                key: prefix.to_owned(),
                reached: answered,
                nodes: n,
                needed: q,
                failures,
            });
        }
        let unanswered = n - answered;
        let now = SystemTime::now();
        let locks = by_key
            .into_iter()
            .filter_map(|(key, answers)| merge(key, &answers, answered, unanswered, q, now))
            .collect();
        Ok(Inventory {
            locks,
            nodes: n,
            quorum: q,
            failures,
            truncated,
        })
    }
}

/// One key's answers merged (pure): listed when its value stands, or may stand, on a quorum.
/// `answers` has one entry per node (`None`: absent there, or the node did not answer); `now`
/// bounds the acquisition times believed.
fn merge(
    key: String,
    answers: &[Option<Answer>],
    answered: usize,
    unanswered: usize,
    q: usize,
    now: SystemTime,
) -> Option<HeldLock> {
    let mut values: Vec<Option<&str>> = answers
        .iter()
        .map(|a| a.as_ref().map(|(v, _, _)| v.as_str()))
        .collect();
    // The answering nodes where the key is absent count as answers without a value.
    let present = values.iter().flatten().count();
    values.retain(Option::is_some);
    values.extend(std::iter::repeat_n(None, answered.saturating_sub(present)));
    let (value, certain) = match quorum::holder_view(&values, unanswered, q) {
        HolderView::Held(v) => (v.to_owned(), true),
        HolderView::Vacant => return None,
        HolderView::Unknown => {
            // The value seen most often: the one the unanswered nodes could complete.
            let count = |v: &str| values.iter().filter(|w| **w == Some(v)).count();
            let top = values.iter().flatten().max_by_key(|v| count(v))?;
            (top.to_string(), false)
        }
    };
    let holding: Vec<&Answer> = answers
        .iter()
        .flatten()
        .filter(|(v, _, _)| *v == value)
        .collect();
    let mut pttls: Vec<i64> = holding.iter().map(|(_, p, _)| *p).collect();
    pttls.sort_unstable_by(|a, b| b.cmp(a));
    let ttl = pttls
        .get(q - 1)
        .and_then(|&p| u64::try_from(p).ok())
        .map(Duration::from_millis);
    let fence = holding.iter().map(|(_, _, f)| *f).max().unwrap_or(0);
    Some(HeldLock {
        owner: value::owner_of(&value),
        acquired_at: value::acquired_at_of(&value, now),
        held_on: holding.len(),
        certain,
        ttl,
        fence: FencingToken::new(fence),
        key,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(v: &str, pttl: i64, fence: u64) -> Option<Answer> {
        Some((v.to_owned(), pttl, fence))
    }

    #[test]
    fn a_dated_value_gives_the_lock_its_age() {
        let now = SystemTime::now();
        let value = value::new_value_of("@w");
        let answers = [at(&value, 900, 1), at(&value, 900, 1), None];
        let held = merge("k".into(), &answers, 3, 0, 2, now).unwrap();
        let made = held.acquired_at.expect("dated");
        assert!(made <= now, "{made:?} {now:?}");
        assert_eq!(
            held.age(made + Duration::from_secs(7)),
            Some(Duration::from_secs(7))
        );
        // A host's clock ahead of the reader's: age zero, not negative.
        assert_eq!(
            held.age(made - Duration::from_secs(7)),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn a_key_is_listed_only_where_a_quorum_holds_it_or_may() {
        let now = SystemTime::now();
        // 5 nodes, 4 answered: a bare majority is held, with the 3rd longest ttl.
        let bare = [
            at("a", 900, 4),
            at("a", 800, 4),
            at("a", 700, 5),
            None,
            None,
        ];
        let held = merge("k".into(), &bare, 4, 1, 3, now).unwrap();
        assert!(held.certain);
        assert_eq!(
            (held.held_on, held.ttl),
            (3, Some(Duration::from_millis(700)))
        );
        assert_eq!(held.fence, FencingToken::new(5));
        assert_eq!(
            (held.acquired_at, held.age(now)),
            (None, None),
            "not a dated value"
        );
        // Two nodes and one unanswered could make a quorum: listed, not certain.
        let maybe = [at("a", 900, 4), at("a", 800, 4), None, None, None];
        let maybe = merge("k".into(), &maybe, 4, 1, 3, now).unwrap();
        assert!(!maybe.certain);
        assert_eq!(maybe.ttl, None);
        // A remnant on one node: not a lock.
        let remnant = [at("a", 900, 4), None, None, None, None];
        assert_eq!(merge("k".into(), &remnant, 4, 1, 3, now), None);
        assert_eq!(merge("k".into(), &remnant, 5, 0, 3, now), None);
    }
}

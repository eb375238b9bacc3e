//! Who leads an election, for anyone (candidate or not): [`Observer::leader`] reads it from a
//! quorum, [`Observer::observe`] streams its changes.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::Stream;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::notices::{Fresh, Notice, Notifier, wait_for};
use super::record::{Keys, Record};
use crate::client::status::LockStatus;
use crate::core::quorum::HolderView;
use crate::core::token::FencingToken;
use crate::error::{Error, NodeFailure};
use crate::lock::redlock::Redlock;

/// Reads who leads an election and streams its changes, without being a candidate: no
/// candidate id, no campaign. Obtained from
/// [`ElectionBuilder::observer`](super::ElectionBuilder::observer), or from a candidate's
/// [`Election::observer`](super::Election::observer) (then sharing its subscriptions). Cheap
/// to clone.
///
/// ```no_run
/// use futures::StreamExt;
/// use quorumlock::{Election, Observation, Redlock};
///
/// # async fn run(locks: Redlock) -> Result<(), quorumlock::Error> {
/// let observer = Election::builder(locks, "scheduler").observer()?;
/// let mut changes = Box::pin(observer.observe());
/// while let Some(change) = changes.next().await {
///     match change {
///         Observation::Leader(l) => tracing::info!(leader = ?l.candidate, token = %l.token, "a candidate leads"),
///         Observation::Vacant => tracing::info!("nobody leads"),
///         Observation::Unknown(e) => tracing::warn!(error = %e, "cannot tell who leads"),
///         _ => {}
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Observer {
    pub(crate) shared: Arc<Shared>,
}

/// What an election's observers and candidates share: the client, the keys, the subscriptions.
pub(crate) struct Shared {
    pub(crate) locks: Redlock,
    pub(crate) name: String,
    pub(crate) poll: Duration,
    pub(crate) keys: Keys,
    notifier: OnceLock<Notifier>,
}

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("name", &self.shared.name)
            .field("poll_interval", &self.shared.poll)
            .finish()
    }
}

/// Who leads an election, read from a quorum by [`Observer::leader`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// The leader's candidate id; `None` while a new leader has not yet published its record
    /// (a few milliseconds after it won), or if it could not write it on any node.
    pub candidate: Option<String>,
    /// The term's fencing token: writes stamped with an older token come from an earlier term.
    pub token: FencingToken,
    /// How long the term lasts unless its leader extends it (it normally does, every ttl / 3).
    pub expires_in: Duration,
    /// The owner name the leader's client set
    /// ([`RedlockBuilder::owner`](crate::RedlockBuilder::owner)), read from the term's lock
    /// value itself: known as soon as the term is, even before the leader record is written.
    pub owner: Option<String>,
}

/// An item of [`Observer::observe`]: what a quorum says about the election.
#[derive(Debug)]
#[non_exhaustive]
pub enum Observation {
    /// A candidate leads (a new term, or the same term whose leader published its id): which
    /// one is in [`Leader::candidate`], not necessarily the observing one.
    Leader(Leader),
    /// Nobody leads (and the nodes that did not answer could not change that).
    Vacant,
    /// Too few nodes answered to tell, or the nodes that did not answer could complete a
    /// leader's quorum (see [`Observer::leader`]).
    Unknown(Error),
}

impl Observer {
    pub(crate) fn new(locks: Redlock, name: String, poll: Duration) -> Self {
        Observer {
            shared: Arc::new(Shared {
                keys: Keys::new(locks.engine().keys(), &name),
                locks,
                name,
                poll,
                notifier: OnceLock::new(),
            }),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Who leads now, and since which token, read from every node (a quorum must answer).
    ///
    /// The leader is the lock value held by a quorum; its id comes from the leader record bound
    /// to that value. `Ok(None)` means nobody leads: no value stands on a quorum, and the nodes
    /// that did not answer could not complete one either.
    ///
    /// # Errors
    ///
    /// [`Error::NoQuorum`] when fewer nodes answered than this read needed to tell who leads:
    /// a quorum, or more when the nodes that did not answer could still complete a quorum for
    /// some value (the leader's key on nodes {0,1,2}, a read that reached {1,2,3,4}: it may
    /// lead, or not; `needed` is then 5, the answers it takes to tell). Either way the error
    /// means "too few answers to know", names each node that did not answer, and clears as
    /// nodes answer again. [`Error::InvalidArgument`] for an invalid election name.
    ///
    /// # Cancellation safety
    ///
    /// Cancel-safe: it only reads.
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        let sh = &*self.shared;
        let (status, records) =
            tokio::join!(sh.locks.status(&sh.name), sh.keys.read(sh.locks.engine()));
        let status = status?;
        // Named after the election (the status' key is the election's name too).
        status.require_quorum()?;
        if status.holder_view() == HolderView::Unknown {
            return Err(undecided(&status));
        }
        let records: Vec<Record> = records
            .answers()
            .filter_map(|r| Record::parse(r.as_deref()?))
            .collect();
        Ok(leader_from(&status, &records))
    }

    /// A stream of leadership changes: the current state first, then an item each time the
    /// leader (its token or id) changes, nobody leads any more, or the nodes stop answering.
    /// Driven by the election's notifications, by the current term's expiry and by the poll
    /// interval.
    ///
    /// Subscriptions start when the stream is first polled; it needs a tokio runtime.
    pub fn observe(&self) -> impl Stream<Item = Observation> + Send + 'static {
        let state = Watch {
            observer: self.clone(),
            notices: None,
            fresh: Fresh::default(),
            last: None,
            wait_until: None,
        };
        futures::stream::unfold(state, |mut st| async move {
            let obs = st.next().await;
            Some((obs, st))
        })
    }

    /// The poll interval with ±25 % jitter.
    pub(crate) fn poll_pause(&self) -> Duration {
        self.shared.poll.mul_f64(0.75 + 0.5 * rand::random::<f64>())
    }

    /// Starts the subscriptions on first use and returns a receiver of their notices. Without
    /// a tokio runtime there are no subscriptions (a later call in a runtime starts them): the
    /// receiver is closed, and standbys and observers rely on their timers alone.
    pub(crate) fn notices(&self) -> broadcast::Receiver<Notice> {
        let sh = &*self.shared;
        if let Some(notifier) = sh.notifier.get() {
            return notifier.subscribe_notices();
        }
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => sh
                .notifier
                .get_or_init(|| Notifier::start(&sh.locks, &sh.keys.channel, &handle))
                .subscribe_notices(),
            Err(_) => {
                tracing::debug!(election = %sh.name, "no tokio runtime: no notifications, polling only");
                broadcast::channel(1).1
            }
        }
    }

    /// One read for observers: re-reads a few times while a new leader's id is not published.
    async fn observe_once(&self) -> Observation {
        for _ in 0..3 {
            match self.leader().await {
                Ok(Some(l)) if l.candidate.is_none() => {
                    tokio::time::sleep(self.shared.locks.engine().retry_pause()).await;
                }
                other => return observation(other),
            }
        }
        observation(self.leader().await)
    }
}

fn observation(read: Result<Option<Leader>, Error>) -> Observation {
    match read {
        Ok(Some(l)) => Observation::Leader(l),
        Ok(None) => Observation::Vacant,
        Err(e) => Observation::Unknown(e),
    }
}

/// The error of a read that a quorum answered but that cannot tell who leads: the nodes that did
/// not answer could complete a quorum for the largest group of one value. `needed` is how many
/// answers it takes to rule that out.
fn undecided(status: &LockStatus) -> Error {
    let values: Vec<&str> = status
        .nodes
        .iter()
        .filter_map(|n| n.state.as_ref().ok()?.value.as_deref())
        .collect();
    let top = values
        .iter()
        .map(|v| values.iter().filter(|w| *w == v).count())
        .max()
        .unwrap_or(0);
    let n = status.nodes.len();
    let failures: Vec<NodeFailure> = status
        .nodes
        .iter()
        .filter_map(|s| {
            s.state.as_ref().err().map(|cause| NodeFailure {
                node: s.node.clone(),
                cause: cause.clone(),
            })
        })
        .collect();
    // Unanswered nodes must stay below `quorum - top` for no value to reach a quorum.
    let needed = (n + 1 + top)
        .saturating_sub(status.quorum)
        .clamp(status.quorum, n);
    Error::no_quorum(&status.key, status.answered(), n, needed, failures)
}

/// The state of an [`Observer::observe`] stream.
struct Watch {
    observer: Observer,
    notices: Option<broadcast::Receiver<Notice>>,
    /// Notices already acted on (so the N copies of one cause one read).
    fresh: Fresh,
    last: Option<Seen>,
    wait_until: Option<Instant>,
}

/// What an observer last reported, to report changes only.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Leader(FencingToken, Option<String>),
    Vacant,
    Unknown,
}

impl Watch {
    async fn next(&mut self) -> Observation {
        let notices = self.notices.get_or_insert_with(|| self.observer.notices());
        loop {
            if let Some(until) = self.wait_until.take() {
                let fresh = &mut self.fresh;
                wait_for(notices, until, |n| fresh.first_copy(n)).await;
            }
            let obs = self.observer.observe_once().await;
            let poll = self.observer.poll_pause();
            let (key, wait) = match &obs {
                Observation::Leader(l) => (
                    Seen::Leader(l.token, l.candidate.clone()),
                    (l.expires_in + Duration::from_millis(5)).min(poll),
                ),
                Observation::Vacant => (Seen::Vacant, poll),
                Observation::Unknown(_) => (Seen::Unknown, poll),
            };
            self.wait_until = Some(Instant::now() + wait);
            if self.last.as_ref() != Some(&key) {
                self.last = Some(key);
                return obs;
            }
        }
    }
}

/// The leader a status read and the leader records describe.
pub(crate) fn leader_from(status: &LockStatus, records: &[Record]) -> Option<Leader> {
    let value = status.holder()?;
    let held: Vec<_> = status
        .nodes
        .iter()
        .filter_map(|n| n.state.as_ref().ok())
        .filter(|s| s.value.as_deref() == Some(value))
        .collect();
    let record = records.iter().find(|r| r.value == value);
    // Without a record: the counter most of the holding nodes agree on (the acquisition brought
    // a quorum of them to the token; a node that answered it late may stand higher or lower),
    // the highest of equals (the token is the highest counter of the nodes that answered the
    // acquisition in time, so a lower one of equals is a late node's).
    let token = record.map(|r| r.token).unwrap_or_else(|| {
        let mut fences: Vec<FencingToken> = held.iter().map(|s| s.fence).collect();
        fences.sort_unstable();
        let count = |f: &FencingToken| fences.iter().filter(|g| *g == f).count();
        // `max_by_key` keeps the last of equals: in ascending order, the highest.
        (fences.iter().copied().max_by_key(count)).unwrap_or(FencingToken::new(0))
    });
    let mut ttls: Vec<Duration> = held.iter().filter_map(|s| s.ttl).collect();
    ttls.sort_by(|a, b| b.cmp(a));
    let expires_in = ttls
        .get(status.quorum.saturating_sub(1))
        .copied()
        .unwrap_or_default();
    Some(Leader {
        candidate: record.map(|r| r.candidate.clone()),
        token,
        expires_in,
        owner: crate::core::value::owner_of(value),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::status::NodeStatus;
    use crate::election::tests::{down, node, status};
    use crate::error::NodeError;

    fn rec(s: &str) -> Record {
        Record::parse(s).expect("a record")
    }

    #[test]
    fn leader_comes_from_the_record_bound_to_the_quorum_value() {
        let s = status(vec![
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(800), 8),
            node(Some("new"), Some(950), 9), // answered the acquisition late
            node(Some("old"), Some(100), 5),
            down(),
        ]);
        let records = vec![rec("old 5 crashed"), rec("new 8 host b")];
        let l = leader_from(&s, &records).expect("a leader");
        assert_eq!(l.candidate.as_deref(), Some("host b"));
        assert_eq!(l.token, FencingToken::new(8));
        // Fewer than a quorum would hold it after the third-longest ttl.
        assert_eq!(l.expires_in, Duration::from_millis(800));

        // Only the stale record: the id is unknown, the token is the quorum's counter.
        let l = leader_from(&s, &records[..1]).expect("a leader");
        assert_eq!(l.candidate, None);
        assert_eq!(l.token, FencingToken::new(8));
        let counters_disagree = status(vec![
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 9),
            node(Some("new"), Some(900), 7),
        ]);
        // No majority among the holders: the highest counter (the token is the highest
        // counter among the nodes that answered the acquisition in time).
        assert_eq!(
            leader_from(&counters_disagree, &[]).unwrap().token,
            FencingToken::new(9)
        );
        // A tie: two nodes at 8 (the token; raised by the acquisition), two late ones at 6.
        let tie = status(vec![
            node(Some("new"), Some(900), 6),
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 6),
            down(),
        ]);
        assert_eq!(leader_from(&tie, &[]).unwrap().token, FencingToken::new(8));
        // A majority wins over a higher late counter.
        let late_higher = status(vec![
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 8),
            node(Some("new"), Some(900), 12),
        ]);
        assert_eq!(
            leader_from(&late_higher, &[]).unwrap().token,
            FencingToken::new(8)
        );
    }

    #[test]
    fn an_undecided_read_refused_by_permissions_says_so() {
        // Two of three nodes refuse the read's GET: no answer can ever decide it.
        let denied = || NodeStatus {
            state: Err(NodeError::Denied {
                command: "GET".to_owned(),
                reason: "the command",
            }),
            ..down()
        };
        let s = status(vec![node(Some("a"), Some(900), 1), denied(), denied()]);
        match undecided(&s) {
            Error::PermissionDenied {
                command, denied, ..
            } => assert_eq!((command.as_str(), denied), ("GET", 2)),
            other => panic!("{other:?}"),
        }
        // Where one refusal leaves enough nodes to decide (four answers of five wanted), it is a
        // NoQuorum that lists it among the failures.
        let s = status(vec![
            node(Some("a"), Some(900), 1),
            node(Some("b"), Some(900), 2),
            node(None, None, 2),
            denied(),
            down(),
        ]);
        match undecided(&s) {
            Error::NoQuorum {
                needed, failures, ..
            } => assert_eq!((needed, failures.len()), (4, 2)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_leader_without_a_quorum_value() {
        let s = status(vec![
            node(Some("a"), Some(900), 1),
            node(Some("a"), Some(900), 1),
            node(Some("b"), Some(900), 2),
            node(None, None, 2),
            down(),
        ]);
        assert_eq!(leader_from(&s, &[rec("a 1 x")]), None);
    }

    #[test]
    fn an_undecided_read_names_the_answers_it_needed() {
        // The leader's key on {0,1,2}, a read that reached {1,2,3,4}: all five are needed.
        let s = status(vec![
            down(),
            node(Some("a"), Some(900), 1),
            node(Some("a"), Some(900), 1),
            node(None, None, 1),
            node(None, None, 1),
        ]);
        assert_eq!(s.holder_view(), HolderView::Unknown);
        match undecided(&s) {
            Error::NoQuorum {
                reached,
                needed,
                nodes,
                failures,
                ..
            } => {
                assert_eq!((reached, needed, nodes), (4, 5, 5));
                assert_eq!(failures.len(), 1);
            }
            other => panic!("{other:?}"),
        }
    }
}

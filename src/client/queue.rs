//! The waiters of one key in one client: their FIFO queue (only the head makes rounds), the
//! release notices counted (a release is announced by every node where it deleted the key), and
//! how long a woken head defers its round. The queue owns this state: the other files call its
//! methods. The subscriptions that feed it are `wait.rs`'s.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::lock;

/// Released values remembered per key, to count each release once.
const SEEN: usize = 8;

/// The waiters of one key in this client.
#[derive(Debug)]
pub(super) struct KeyWait {
    state: Mutex<QueueState>,
    /// Notified (all waiters) on a release notice and when the queue's head changes.
    notify: Notify,
    /// The key's waiters marker, also the channel of its release notices.
    channel: String,
}

#[derive(Debug, Default)]
struct QueueState {
    /// Release notices counted so far.
    epoch: u64,
    /// The last released values, each with the nodes that announced it (one bit per node: a
    /// notice comes once from every node where the release deleted the key).
    seen: VecDeque<(String, u64)>,
    /// This client's waiters, oldest first.
    queue: VecDeque<u64>,
    next_ticket: u64,
    /// Set when the head left the queue holding the lock: the value it won with. The next head
    /// waits for that value's release notice (or a possible loss of notices) before its first
    /// round. Counting notices instead woke it too early: the second wake of the release before
    /// the win (its quorum of notices, `released`) can arrive during or after the winning round,
    /// and the next head's round then met the winner's own release half-way.
    handed: Option<String>,
    /// The notice count when `handed` was set: a later notice of another release tells the
    /// head that the key changed hands, so the lock it waits for may have ended without a
    /// notice (forgotten, expired, lost, or released after the waiters marker lapsed).
    handed_at: u64,
    /// Until when the marker set on the nodes stands (less the refresh margin).
    marker_until: Option<Instant>,
    /// Values this client released lately: a notice of one of them is a release by us.
    own: VecDeque<String>,
    /// How long the head waits after the last notice before its round (see [`defer`]).
    defer: Duration,
}

/// A release notice as one node's subscription passes it on.
#[derive(Debug, Clone, Copy)]
pub(super) struct ReleaseNotice<'a> {
    /// The released value.
    pub(super) value: &'a str,
    /// How many clients waited (the release script's count of the waiters marker).
    pub(super) clients: u64,
    /// The node that announced it.
    pub(super) node: usize,
    /// The client's quorum.
    pub(super) quorum: usize,
}

/// A waiter's place in its key's queue; leaving (dropped) hands the turn on.
pub(super) struct Ticket {
    kw: Arc<KeyWait>,
    id: u64,
    /// Set once the waiter won: the value it won with.
    won: Option<String>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut st = lock(&self.kw.state);
        let was_head = st.queue.front() == Some(&self.id);
        st.queue.retain(|&t| t != self.id);
        if was_head {
            st.handed = self.won.take();
            st.handed_at = st.epoch;
        }
        drop(st);
        if was_head {
            self.kw.notify.notify_waiters();
        }
    }
}

impl Ticket {
    /// Records that this waiter won, with `value`.
    pub(super) fn won(&mut self, value: &str) {
        self.won = Some(value.to_owned());
    }
}

/// How a queued waiter's wait for its turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// It is the head, and the lock its predecessor won is released.
    Now,
    /// It is the head, still waiting for its predecessor's release, and another release was
    /// announced: the key changed hands, so that lock may have ended without a notice.
    Changed,
    /// The timer fired.
    Timer,
}

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Woken {
    /// A release notice arrived (or notices may have been missed).
    Notice,
    /// The timer fired.
    Timer,
}

impl KeyWait {
    /// The waiters of the key whose waiters marker (and notice channel) is `channel`.
    pub(super) fn new(channel: String) -> Self {
        KeyWait {
            state: Mutex::default(),
            notify: Notify::new(),
            channel,
        }
    }

    /// The key's waiters marker, also the channel of its release notices.
    pub(super) fn channel(&self) -> &str {
        &self.channel
    }

    /// A new waiter's place, behind every waiter queued now.
    pub(super) fn join(kw: &Arc<Self>) -> Ticket {
        let mut st = lock(&kw.state);
        let id = st.next_ticket;
        st.next_ticket += 1;
        st.queue.push_back(id);
        Ticket {
            kw: Arc::clone(kw),
            id,
            won: None,
        }
    }

    /// Whether any waiter is queued.
    pub(super) fn has_queue(&self) -> bool {
        !lock(&self.state).queue.is_empty()
    }

    /// Whether the waiters marker is due to be set (or refreshed) at `now`; if so, counts it as
    /// standing until `until` from now on (the caller sets it).
    pub(super) fn marker_due(&self, now: Instant, until: Instant) -> bool {
        let mut st = lock(&self.state);
        if st.marker_until.is_some_and(|u| u > now) {
            return false;
        }
        st.marker_until = Some(until);
        true
    }

    /// The number of release notices so far: a round that starts now reacts to later ones.
    pub(super) fn epoch(&self) -> u64 {
        lock(&self.state).epoch
    }

    /// Counts a release of `value` announced by node `node` to `clients` waiting clients (or,
    /// with `None`, a possible loss of notices) and wakes the waiters, twice per release: at its
    /// first notice (the fastest handover: the release usually reaches the other nodes before
    /// the waiter's round does), and once `quorum` nodes have announced it (a round is sure to
    /// find the key gone on a quorum then: a round woken by the first notice can be refused by
    /// the nodes the release had not reached yet, and would otherwise wait for its timer).
    /// Other copies of a release are ignored, but for the release of the lock the previous head
    /// won (`handed`): its first copy to arrive gives the next head its turn.
    pub(super) fn released(&self, notice: Option<ReleaseNotice<'_>>) {
        let mut st = lock(&self.state);
        // The release the next head waits for (any copy of it), or notices maybe missed.
        if notice.is_none_or(|n| st.handed.as_deref() == Some(n.value))
            && st.handed.take().is_some()
        {
            self.notify.notify_waiters();
        }
        if let Some(ReleaseNotice {
            value: v,
            clients,
            node,
            quorum,
        }) = notice
        {
            let bit = 1u64.checked_shl(node as u32).unwrap_or(0);
            if let Some((_, nodes)) = st.seen.iter_mut().find(|(s, _)| s == v) {
                let before = nodes.count_ones() as usize;
                *nodes |= bit;
                if before >= quorum || nodes.count_ones() as usize != quorum {
                    return;
                }
            } else {
                if st.seen.len() == SEEN {
                    st.seen.pop_front();
                }
                st.seen.push_back((v.to_owned(), bit));
            }
            let ours = st.own.iter().any(|s| s == v);
            st.defer = defer(clients, ours, rand::random::<f64>());
        } else {
            st.defer = Duration::ZERO;
        }
        st.epoch += 1;
        drop(st);
        self.notify.notify_waiters();
    }

    /// Remembers a value this client released.
    pub(super) fn ours(&self, value: &str) {
        let mut st = lock(&self.state);
        if st.own.len() == SEEN {
            st.own.pop_front();
        }
        st.own.push_back(value.to_owned());
    }

    /// How long the head should wait, after the last notice, before its round.
    pub(super) fn deferral(&self) -> Duration {
        lock(&self.state).defer
    }

    /// Waits until `ticket` is at the head of the queue and, if the previous head left
    /// holding the lock, until that lock's release is announced ([`Turn::Now`]); or, while the
    /// head waits for that release, until another release after notice `since` (and after the
    /// predecessor left) is announced ([`Turn::Changed`]); or until `until`.
    pub(super) async fn turn(&self, ticket: &Ticket, until: Option<Instant>, since: u64) -> Turn {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = lock(&self.state);
                if st.queue.front() == Some(&ticket.id) {
                    if st.handed.is_none() {
                        return Turn::Now;
                    }
                    if st.epoch > since.max(st.handed_at) {
                        return Turn::Changed;
                    }
                }
            }
            match until {
                Some(t) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(t) => return Turn::Timer,
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Waits for a release notice after `epoch`, or until `until`.
    pub(super) async fn released_after(&self, epoch: u64, until: Instant) -> Woken {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if lock(&self.state).epoch > epoch {
                return Woken::Notice;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(until) => return Woken::Timer,
            }
        }
    }

    /// The head found the lock its predecessor won gone without a notice of its release (its
    /// key expired, it was forgotten or lost, or the notices were lost): it stops waiting for
    /// that release.
    pub(super) fn handover_missed(&self) {
        lock(&self.state).handed = None;
    }

    /// Whether `ticket` is the oldest waiter.
    pub(super) fn is_head(&self, ticket: &Ticket) -> bool {
        lock(&self.state).queue.front() == Some(&ticket.id)
    }
}

/// Waits for a release notice of any of the keys of `kws` after its epoch in `epochs` (one
/// per key), or until `until`.
pub(super) async fn released_after_any(
    kws: &[Arc<KeyWait>],
    epochs: &[u64],
    until: Instant,
) -> Woken {
    if kws.is_empty() {
        tokio::time::sleep_until(until).await;
        return Woken::Timer;
    }
    let any = futures::future::select_all(
        kws.iter()
            .zip(epochs)
            .map(|(kw, &e)| Box::pin(kw.released_after(e, until))),
    );
    any.await.0
}

/// The first of the keys of `kws` released (or maybe missed) since its epoch in `epochs`.
pub(super) fn first_released(kws: &[Arc<KeyWait>], epochs: &[u64]) -> Option<usize> {
    kws.iter().zip(epochs).position(|(kw, &e)| kw.epoch() > e)
}

/// The longest a woken head defers its round when other clients wait too.
pub(super) const DEFER: Duration = Duration::from_millis(2);

/// How long a head woken by a release defers its round: nothing when its client is the only
/// one waiting (no competitor: handover in one round); otherwise a random part of [`DEFER`],
/// and two whole [`DEFER`]s more when the release was its own client's (time for the others
/// to resolve a split vote among themselves). Redis delivers a notice to
/// its subscribers in a fixed order, so without the random part the first subscriber would win
/// every race; without the extra part for the releasing client, a client with several waiters
/// would pass the lock between its own tasks.
pub(super) fn defer(clients: u64, ours: bool, unit: f64) -> Duration {
    if clients <= 1 {
        return Duration::ZERO;
    }
    let random = DEFER.mul_f64(unit.clamp(0.0, 1.0));
    if ours { DEFER * 2 + random } else { random }
}

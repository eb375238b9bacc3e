//! A counting semaphore over the same nodes as the locks: [`Semaphore`], at most `permits`
//! holders at a time, each holding a [`Permit`].
//!
//! Permit `i` of semaphore `NAME` is an ordinary lock on the key `NAME:permit:i` (its own
//! quorum, its own fencing counter, its own hash slot). At most one valid holder per key is the
//! lock's guarantee, so at most `permits` valid holders in all, under exactly the lock's
//! assumptions and with the lock's fault tolerance (a majority of nodes), whatever `permits` is.
//! `docs/safety.md` ("Semaphores") gives the argument, and why one sorted set of holders per
//! node, admitted by a majority, would not bound the holders.
//!
//! Acquiring sweeps the permits once, starting at a random one (so that concurrent acquirers
//! spread over the free permits), trying each in one round; a full semaphore costs one round
//! per permit per sweep (hence [`Semaphore::MAX_PERMITS`]). A round that node failures alone
//! ruled out ends the sweep: the other permits' rounds would ask the same nodes.
//!
//! Sweeps are the rounds of one acquisition, and it waits between them as a lock's acquisition
//! does (`client/waiter.rs`, one waiter over every permit's key): [`Semaphore::acquire_timeout`]
//! *waits*: when every permit is held it marks every permit's key as waited on and subscribes
//! to their release notices, and sweeps again when one is released (starting at that permit),
//! or once the first permit's holder may have expired (each permit key's `PTTL`, at most 1 s).
//! The waiters of one client form one FIFO queue per semaphore (the queue of permit 0's key):
//! only the oldest sweeps, and a task that has just released a permit and asks again queues
//! behind the others instead of taking it back at once. Between clients there is no queue:
//! each client's oldest waiter sweeps at a release, after the deferral of `queue::defer`.

use std::time::Duration;

use crate::client::waiter::{Patience, Waiter};
use crate::core::keys::check_key;
use crate::error::{ArgumentError, Error};
use crate::lock::guard::Lock;
use crate::lock::redlock::Redlock;

/// A counting semaphore: at most [`permits`](Self::permits) holders at once across every
/// client of the same nodes. Cheap to clone.
///
/// Every client must use the same number of permits for a name: a client told 5 may hold
/// permits 3 and 4, which a client told 3 never counts.
///
/// ```no_run
/// # async fn run(locks: quorumlock::Redlock) -> Result<(), quorumlock::Error> {
/// use std::time::Duration;
/// use quorumlock::Semaphore;
///
/// // At most 3 exports at once, across every host.
/// let exports = Semaphore::new(&locks, "exports", 3)?;
/// let permit = exports
///     .acquire_timeout(Duration::from_secs(30), Duration::from_secs(60))
///     .await?;
/// println!("permit {} of 3, token {}", permit.index(), permit.token());
/// tokio::select! {
///     _ = permit.lost() => eprintln!("permit lost; stopping"),
///     _ = tokio::time::sleep(Duration::from_secs(5)) => {} // the export
/// }
/// permit.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    client: Redlock,
    name: String,
    permits: u32,
}

impl Redlock {
    /// A [`Semaphore`] named `name` with `permits` permits on this client's nodes: as
    /// [`Semaphore::new`].
    ///
    /// # Errors
    ///
    /// As [`Semaphore::new`].
    pub fn semaphore(&self, name: &str, permits: u32) -> Result<Semaphore, Error> {
        Semaphore::new(self, name, permits)
    }
}

impl Semaphore {
    /// The most permits a semaphore takes. A sweep over a full semaphore costs one round per
    /// permit, and a waiter watches every permit's key: the cost grows with the count by
    /// design, so the count is bounded where a sweep still takes well under a second and a
    /// waiter a few hundred kilobytes. For more holders at once, use several semaphores.
    ///
    /// ```
    /// # fn f() -> Result<(), quorumlock::Error> {
    /// use quorumlock::{ArgumentError, Error, Semaphore};
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build()?;
    /// assert!(Semaphore::new(&locks, "s", Semaphore::MAX_PERMITS).is_ok());
    /// assert!(matches!(
    ///     Semaphore::new(&locks, "s", Semaphore::MAX_PERMITS + 1),
    ///     Err(Error::InvalidArgument(ArgumentError::Permits { .. }))
    /// ));
    /// # Ok(()) }
    /// # f().unwrap();
    /// ```
    pub const MAX_PERMITS: u32 = 1000;

    /// A semaphore named `name` allowing `permits` holders at once, on `client`'s nodes.
    ///
    /// ```
    /// # fn f() -> Result<(), quorumlock::Error> {
    /// let locks = quorumlock::Redlock::builder(["redis://127.0.0.1:7001"]).build()?;
    /// let sem = quorumlock::Semaphore::new(&locks, "exports", 3)?;
    /// assert_eq!(sem.permit_key(2), Some("exports:permit:2".to_owned()));
    /// assert!(quorumlock::Semaphore::new(&locks, "exports", 0).is_err());
    /// # Ok(()) }
    /// # f().unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] ([`ArgumentError::Permits`]) when `permits` is 0 or above
    /// [`MAX_PERMITS`](Self::MAX_PERMITS); [`Error::InvalidArgument`] when `name` is not a
    /// valid lock key.
    pub fn new(client: &Redlock, name: &str, permits: u32) -> Result<Self, Error> {
        check_key(name)?;
        if !(1..=Self::MAX_PERMITS).contains(&permits) {
            return Err(ArgumentError::Permits {
                permits,
                max: Self::MAX_PERMITS,
            }
            .into());
        }
        Ok(Semaphore {
            client: client.clone(),
            name: name.to_owned(),
            permits,
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many holders it allows at once.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The lock key of permit `index` (`None` past the last permit): what
    /// [`Redlock::status`] takes to show who holds it.
    pub fn permit_key(&self, index: u32) -> Option<String> {
        (index < self.permits).then(|| format!("{}:permit:{index}", self.name))
    }

    /// One sweep over the permits: a free permit, or why not at once.
    ///
    /// # Errors
    ///
    /// As [`acquire_timeout`](Self::acquire_timeout).
    ///
    /// # Cancellation safety
    ///
    /// As [`Redlock::try_acquire`].
    pub async fn try_acquire(&self, ttl: Duration) -> Result<Permit, Error> {
        self.acquire_with(ttl, 1, Duration::ZERO).await
    }

    /// As [`acquire_timeout`](Self::acquire_timeout) with no extra wait: up to
    /// `1 + retry_count` sweeps.
    ///
    /// # Errors
    ///
    /// As [`acquire_timeout`](Self::acquire_timeout).
    ///
    /// # Cancellation safety
    ///
    /// As [`Redlock::try_acquire`].
    pub async fn acquire(&self, ttl: Duration) -> Result<Permit, Error> {
        self.acquire_timeout(ttl, Duration::ZERO).await
    }

    /// Takes a free permit with a lease of `ttl` that extends itself (every `ttl / 3`) until
    /// the permit is released, dropped or lost. Sweeps the permits (each one round, starting
    /// at a random one); while every permit is held it waits for a release (by any client:
    /// woken by its notice, it sweeps from the released permit) or for the first holder's
    /// expiry (read from every permit key's `PTTL`, at most 1 s at a time, or the retry delay
    /// when longer), and sweeps again: at least `1 + retry_count` sweeps, and until `wait` has
    /// passed since the call. The waiters of one client take turns (first come, first served):
    /// a task that has just released a permit and asks again queues behind the others. Its
    /// sweeps wait as a lock's rounds do (see [`Redlock::acquire_timeout`]), and waiting costs
    /// what a lock's waiting costs, per permit. With `wait` zero it pauses between sweeps
    /// after the client's retry policy instead, as [`Redlock::acquire`] does between rounds.
    ///
    /// # Errors
    ///
    /// [`Error::Held`] when every permit is held (`key` is the semaphore's name, `held` the
    /// fewest nodes holding any one permit in the last sweep); [`Error::NoQuorum`] when no permit
    /// could be taken and some could not be asked for lack of nodes (the last such error);
    /// [`Error::InvalidArgument`] for a ttl [`Redlock::try_acquire`] refuses.
    ///
    /// # Cancellation safety
    ///
    /// As [`Redlock::try_acquire`]: an attempt in flight is released in the background.
    pub async fn acquire_timeout(&self, ttl: Duration, wait: Duration) -> Result<Permit, Error> {
        let sweeps = self.client.engine().retry_count().saturating_add(1);
        self.acquire_with(ttl, sweeps, wait).await
    }

    /// The sweeps of one acquisition: at least `sweeps`, and (with a `wait`) waiting for a
    /// release between them until `wait` has passed (see the module's docs).
    async fn acquire_with(
        &self,
        ttl: Duration,
        sweeps: u32,
        wait: Duration,
    ) -> Result<Permit, Error> {
        let engine = self.client.engine();
        engine.check(&self.name, ttl)?;
        let owned = self.permit_keys();
        let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
        let patience = Patience {
            rounds: sweeps,
            wait,
        };
        let mut waiter = Waiter::new(engine, &self.name, &keys, patience).await;
        loop {
            waiter.next_round().await?;
            let start = waiter.released_key().and_then(|i| u32::try_from(i).ok());
            match self.sweep(ttl, start).await {
                Ok(permit) => {
                    waiter.won(permit.value());
                    return Ok(permit);
                }
                Err(err) => waiter.retry(err).await?,
            }
        }
    }

    /// The lock key of every permit, in order.
    fn permit_keys(&self) -> Vec<String> {
        (0..self.permits)
            .map(|i| {
                let key = format!("{}:permit:{i}", self.name);
                self.client
                    .engine()
                    .keys()
                    .lock_keys(&key)
                    .lock()
                    .to_owned()
            })
            .collect()
    }

    /// Tries every permit once, from `start` on (a random one when `None`).
    async fn sweep(&self, ttl: Duration, start: Option<u32>) -> Result<Permit, Error> {
        let start = start.unwrap_or_else(|| rand::random::<u32>() % self.permits);
        let mut fewest_held: Option<usize> = None;
        let mut unreachable: Option<Error> = None;
        for step in 0..self.permits {
            let index = (start + step) % self.permits;
            let key = format!("{}:permit:{index}", self.name);
            match self.client.try_acquire(&key, ttl).await {
                Ok(lock) => {
                    lock.keep_alive();
                    tracing::debug!(semaphore = %self.name, index, token = %lock.token(), "permit taken");
                    return Ok(Permit { lock, index });
                }
                Err(Error::Held { held, .. }) => {
                    fewest_held = Some(fewest_held.map_or(held, |f| f.min(held)));
                }
                // Failures alone ruled this permit out: every permit's round asks the same
                // nodes, so the rest of the sweep would fail alike (one node timeout each).
                Err(e @ Error::NoQuorum { .. }) if !any_refusal(&e) => return Err(e),
                Err(e) if e.is_retryable() => unreachable = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(match (unreachable, fewest_held) {
            (Some(e), _) => e,
            (None, held) => Error::Held {
                key: self.name.clone(),
                held: held.unwrap_or(0),
                nodes: self.client.node_count(),
                needed: self.client.quorum(),
            },
        })
    }
}

/// Whether a [`Error::NoQuorum`] lists a node that refused (another owner holds the key there).
fn any_refusal(e: &Error) -> bool {
    matches!(e, Error::NoQuorum { failures, .. }
        if failures.iter().any(|f| matches!(f.cause, crate::error::NodeError::HeldByAnother)))
}

/// One permit of a [`Semaphore`]: a held [`Lock`] on the permit's key, whose lease extends
/// itself until it is released, dropped or lost.
///
/// It derefs to that [`Lock`]: [`token`](Lock::token) (this permit's fencing token: greater
/// than every earlier holder's *of the same permit*, so a resource fenced by permits keeps the
/// highest token seen per [`key`](Lock::key)), [`lost`](Lock::lost),
/// [`lost_token`](Lock::lost_token), [`validity`](Lock::validity), [`extend`](Lock::extend).
/// Dropping it releases the permit in the background, as a dropped [`Lock`] does.
#[must_use = "dropping the permit releases it at once (in the background); call .release().await to see the result"]
#[derive(Debug)]
pub struct Permit {
    lock: Lock,
    index: u32,
}

impl Permit {
    /// Which permit this is, `0..permits`.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Releases the permit (as [`Lock::release`]).
    ///
    /// # Errors
    ///
    /// As [`Lock::release`].
    ///
    /// # Cancellation safety
    ///
    /// As [`Lock::release`].
    pub async fn release(self) -> Result<(), Error> {
        self.lock.release().await
    }

    /// The permit's lock, to hold (and release) as any other.
    pub fn into_lock(self) -> Lock {
        self.lock
    }
}

impl std::ops::Deref for Permit {
    type Target = Lock;

    fn deref(&self) -> &Lock {
        &self.lock
    }
}

#[cfg(test)]
mod tests {
    //! Why not one sorted set of holders per node with a majority quorum: a pure replay of the
    //! interleaving that admits `permits + 1` holders with no node failing.

    /// A node of that design: admits a holder while it has fewer than `permits`.
    fn admit(node: &mut Vec<char>, permits: usize, holder: char) -> bool {
        if node.len() < permits {
            node.push(holder);
            true
        } else {
            false
        }
    }

    #[test]
    fn a_majority_of_nodes_each_admitting_at_most_p_admits_p_plus_one_holders() {
        let (n, permits, quorum) = (3, 2, 2);
        let mut nodes = vec![Vec::new(); n];
        // Each holder's requests reach the nodes in a different order (no failure, no delay
        // beyond ordinary concurrency): A, C, B on node 0; A, B, C on node 1; B, C, A on node 2.
        let arrivals = [
            (0, ['A', 'C', 'B']),
            (1, ['A', 'B', 'C']),
            (2, ['B', 'C', 'A']),
        ];
        let mut yes = std::collections::BTreeMap::<char, usize>::new();
        for (node, order) in arrivals {
            for holder in order {
                if admit(&mut nodes[node], permits, holder) {
                    *yes.entry(holder).or_default() += 1;
                }
            }
        }
        let holders = yes.values().filter(|&&y| y >= quorum).count();
        assert_eq!(holders, permits + 1, "{yes:?}");
        // One lock per permit instead: at most one holder per permit key, so `permits` holders.
    }
}

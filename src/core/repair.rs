//! The rules of a repair (restoring a restarted node's fencing counters from the others): how
//! many clean sources it needs, when it has read enough, its pacing and page sizes. The repair
//! itself, and the argument for why it is safe, are in `client/repair.rs`. Pure: see
//! [`crate::core`].

use std::time::Duration;

use super::quorum::quorum;

/// Keys asked of a peer per page (`SCAN ... COUNT`), and counters per raise pipeline.
pub(crate) const PAGE: usize = 1000;
/// The smallest page, after timeouts halved it.
pub(crate) const MIN_PAGE: usize = 10;
/// The shortest pause between two steps of a repair.
pub(crate) const MIN_PAUSE: Duration = Duration::from_millis(10);

/// How many complete reads of clean nodes a repair among `n` nodes needs when `clean` other
/// nodes are not themselves awaiting repair: `n - quorum(n) + 1`, or every clean node when
/// fewer exist (more nodes restarted than a quorum tolerates: the best there is).
pub(crate) fn repair_sources_required(n: usize, clean: usize) -> usize {
    (n - quorum(n) + 1).min(clean)
}

/// Whether a repair has read enough to raise: `counted` clean nodes completed a pass, out of
/// `clean` clean nodes among the others; `pending` nodes are still reading (a pass not
/// complete, and their last page answered). With `n - quorum(n) + 1` clean nodes, that many
/// complete passes are enough; with fewer (a best effort), every clean node must have
/// completed one and no reachable node may still be reading.
pub(crate) fn repair_ready(n: usize, clean: usize, counted: usize, pending: usize) -> bool {
    let needed = n - quorum(n) + 1;
    counted >= repair_sources_required(n, clean) && (clean >= needed || pending == 0)
}

/// The pause after a step that took `step`: as long as the step, at least [`MIN_PAUSE`], so a
/// repair keeps its peers busy at most half of the time.
pub(crate) fn repair_pause(step: Duration) -> Duration {
    step.max(MIN_PAUSE)
}

/// The next page size: halved after a timeout (down to [`MIN_PAGE`]), doubled after an answer
/// (up to [`PAGE`]).
pub(crate) fn next_page(page: usize, timed_out: bool) -> usize {
    if timed_out {
        (page / 2).max(MIN_PAGE)
    } else {
        page.saturating_mul(2).clamp(MIN_PAGE, PAGE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repair_needs_n_minus_quorum_plus_one_clean_sources() {
        // 5 nodes: 3 clean complete passes, whatever the others do.
        assert!(!repair_ready(5, 4, 2, 2));
        assert!(repair_ready(5, 4, 3, 1));
        assert!(repair_ready(5, 4, 3, 0));
        // 3 nodes: 2.
        assert!(!repair_ready(3, 2, 1, 1));
        assert!(!repair_ready(3, 2, 1, 0));
        assert!(repair_ready(3, 2, 2, 0));
        assert_eq!(repair_sources_required(5, 4), 3);
        assert_eq!(repair_sources_required(3, 2), 2);
    }

    #[test]
    fn with_too_few_clean_nodes_every_one_and_every_reachable_read_is_needed() {
        // 5 nodes, 2 clean: both must complete, and no reachable node may still be reading.
        assert_eq!(repair_sources_required(5, 2), 2);
        assert!(!repair_ready(5, 2, 1, 0));
        assert!(!repair_ready(5, 2, 2, 1));
        assert!(repair_ready(5, 2, 2, 0));
        // Nobody clean: what the reachable nodes hold, once they are all read.
        assert!(!repair_ready(3, 0, 0, 1));
        assert!(repair_ready(3, 0, 0, 0));
    }

    #[test]
    fn pacing_keeps_peers_busy_at_most_half_the_time() {
        assert_eq!(repair_pause(Duration::ZERO), MIN_PAUSE);
        assert_eq!(repair_pause(Duration::from_millis(3)), MIN_PAUSE);
        assert_eq!(
            repair_pause(Duration::from_millis(40)),
            Duration::from_millis(40)
        );
        assert_eq!(next_page(PAGE, true), PAGE / 2);
        assert_eq!(next_page(MIN_PAGE, true), MIN_PAGE);
        assert_eq!(next_page(PAGE / 2, false), PAGE);
        assert_eq!(next_page(PAGE, false), PAGE);
        assert_eq!(next_page(15, false), 30);
    }
}

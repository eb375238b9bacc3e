//! The checker on hand-made histories: a clean one passes, and each kind of violation is found,
//! so a green chaos run means something. Also the recorder's open sections, the child's record
//! format, and the nemesis' availability promises, on which the checker's verdicts rest.

use std::time::Duration;

use crate::checker::{Uncaught, check};
use crate::child::{Event, Line, classify, decode, encode_op, encode_section, encode_write};
use crate::history::{
    ClockJump, Fault, History, Mono, Op, OpKind, Pause, PendingWrite, Recorder, Section, SessionId,
    Write,
};

const BOUND: Duration = Duration::from_secs(5);

fn ms(t: u64) -> Mono {
    Mono(t * 1_000_000)
}

fn section(
    session: SessionId,
    token: u64,
    acquired: u64,
    until: u64,
    released: Option<u64>,
) -> Section {
    Section {
        session,
        client: session as usize,
        token,
        acquired: ms(acquired),
        valid_until: ms(until),
        released: released.map(ms),
    }
}

fn write(session: SessionId, token: u64, at: u64, accepted: bool) -> Write {
    Write {
        session,
        token,
        start: ms(at),
        end: ms(at + 1),
        accepted,
    }
}

fn history(sections: Vec<Section>, writes: Vec<Write>) -> History {
    History {
        start: ms(0),
        end: ms(1320),
        sections,
        writes,
        ..History::default()
    }
}

/// Three holders one after the other, growing tokens, writes inside their sections.
fn clean() -> History {
    history(
        vec![
            section(1, 10, 0, 1000, Some(100)),
            section(2, 11, 120, 1120, Some(300)),
            section(3, 13, 310, 1310, None),
        ],
        vec![
            write(1, 10, 50, true),
            write(2, 11, 150, true),
            write(2, 11, 250, true),
            write(3, 13, 400, true),
        ],
    )
}

#[test]
fn a_clean_serial_history_has_no_violation() {
    let r = check(&clean(), BOUND);
    assert_eq!(r.violations(), 0, "{r:?}");
    assert_eq!(
        (r.sections, r.writes, r.stale_rejected, r.caught),
        (3, 4, 0, 0)
    );
    // Gaps with no section: 100..120, 300..310, and from session 3's end of validity (1310)
    // to the end of the history (1320); the start (0) is covered.
    assert_eq!(r.worst_gap, Duration::from_millis(20));
}

#[test]
fn a_lock_that_never_comes_back_is_unavailable_until_the_end() {
    let mut h = clean();
    h.end = ms(9_310);
    assert_eq!(check(&h, BOUND).worst_gap, Duration::from_secs(8));
}

#[test]
fn overlapping_sections_are_reported() {
    let mut h = clean();
    // Session 4 acquires while session 2 (released at 300) still holds.
    h.sections.push(section(4, 12, 200, 1200, Some(250)));
    let r = check(&h, BOUND);
    assert_eq!(r.overlaps, vec![(2, 4)]);
    // A section that ends by validity (no release) also counts until its deadline.
    let h = history(
        vec![
            section(1, 1, 0, 500, None),
            section(2, 2, 499, 900, Some(600)),
        ],
        vec![],
    );
    assert_eq!(check(&h, BOUND).overlaps, vec![(1, 2)]);
    // Touching is not overlapping: the next holder may acquire at the instant of release.
    let h = history(
        vec![
            section(1, 1, 0, 500, Some(100)),
            section(2, 2, 100, 900, Some(600)),
        ],
        vec![],
    );
    assert!(check(&h, BOUND).overlaps.is_empty());
}

#[test]
fn tokens_that_do_not_grow_are_reported() {
    let h = history(
        vec![
            section(1, 10, 0, 1000, Some(100)),
            section(2, 10, 120, 1000, Some(200)), // equal
            section(3, 9, 220, 1000, Some(300)),  // lower
            section(4, 11, 320, 1000, Some(400)), // fine again
        ],
        vec![],
    );
    let r = check(&h, BOUND);
    assert_eq!(r.token_regressions, vec![(1, 2), (1, 3)]);
    assert!(r.overlaps.is_empty());
}

#[test]
fn writes_after_validity_are_reported() {
    let mut h = clean();
    // Session 3 is valid until 1310; a write that starts at 1400 came too late.
    h.writes.push(write(3, 13, 1400, true));
    let r = check(&h, BOUND);
    assert_eq!(r.past_validity, vec![4]);
    // Accepted (nobody newer wrote): reported, but not a fencing failure.
    assert!(r.uncaught.is_empty());
    assert_eq!(r.caught, 0);
}

#[test]
fn operations_past_their_bound_are_hung_unless_their_process_was_frozen() {
    let op = |client, start, end| Op {
        client,
        kind: OpKind::Acquire,
        start: ms(start),
        end: ms(end),
        bound: Duration::from_millis(500),
        outcome: "ok",
    };
    let mut h = clean();
    h.ops = vec![op(0, 0, 400), op(0, 1000, 1600), op(1, 2000, 4000)];
    // Client 1 was SIGSTOPped for 1.8 s of its 2 s call: 200 ms of its own time.
    h.pauses = vec![Pause {
        client: 1,
        start: ms(2100),
        end: ms(3900),
    }];
    let r = check(&h, BOUND);
    assert_eq!(r.hung, vec![1]);
}

#[test]
fn an_overlap_whose_stale_writes_were_rejected_is_caught_by_fencing() {
    // Holder 1 (token 20) loses its keys to a wiped majority; holder 2 gets token 3 and overlaps.
    let h = history(
        vec![
            section(1, 20, 0, 1000, Some(800)),
            section(2, 3, 300, 1300, Some(900)),
        ],
        vec![
            write(1, 20, 100, true),
            write(2, 3, 400, false), // stale: the resource has seen 20
            write(1, 20, 500, true),
        ],
    );
    let r = check(&h, BOUND);
    assert_eq!(r.overlaps, vec![(1, 2)]);
    assert_eq!(r.token_regressions, vec![(1, 2)]);
    assert!(r.uncaught.is_empty(), "{:?}", r.uncaught);
    assert_eq!((r.stale_rejected, r.caught), (1, 1));
}

#[test]
fn two_overlapping_sessions_with_one_token_that_both_wrote_are_not_caught() {
    // Two wiped majorities in a row hand out token 1 twice: the resource cannot tell them apart.
    let h = history(
        vec![
            section(1, 1, 0, 1000, Some(800)),
            section(2, 1, 300, 1300, Some(900)),
        ],
        vec![
            write(1, 1, 100, true),
            write(2, 1, 400, true),
            write(1, 1, 500, true),
        ],
    );
    let r = check(&h, BOUND);
    assert_eq!(
        r.uncaught,
        vec![Uncaught::SharedToken {
            a: 1,
            b: 2,
            token: 1
        }]
    );
    // The same token at different times (no overlap of activity) is a regression, not uncaught.
    let h = history(
        vec![
            section(1, 1, 0, 1000, Some(100)),
            section(2, 1, 300, 1300, Some(400)),
        ],
        vec![write(1, 1, 50, true), write(2, 1, 350, true)],
    );
    let r = check(&h, BOUND);
    assert!(r.uncaught.is_empty());
    assert_eq!(r.token_regressions, vec![(1, 2)]);
}

#[test]
fn a_lower_token_accepted_after_a_higher_one_is_not_caught() {
    // A resource that forgot to check: token 5 accepted after token 7 had been.
    let mut h = clean();
    h.writes = vec![
        write(2, 7, 100, true),
        write(1, 5, 200, true),
        write(3, 9, 300, true),
    ];
    let r = check(&h, BOUND);
    assert_eq!(
        r.uncaught,
        vec![Uncaught::OrderBroken {
            earlier: 0,
            later: 1
        }]
    );
    // Concurrent writes (intervals overlap) have no real-time order: not reported.
    h.writes = vec![
        Write {
            end: ms(300),
            ..write(2, 7, 100, true)
        },
        write(1, 5, 200, true),
    ];
    assert!(check(&h, BOUND).uncaught.is_empty());
}

#[test]
fn liveness_is_measured_from_each_heal_to_the_next_acquisition() {
    let mut h = clean();
    h.end = ms(10_000);
    h.faults = vec![
        Fault {
            what: "a".into(),
            start: ms(50),
            healed: ms(110),
            ..Fault::default()
        },
        Fault {
            what: "b".into(),
            start: ms(320),
            healed: ms(2000),
            ..Fault::default()
        },
    ];
    let r = check(&h, BOUND);
    assert_eq!(r.reacquired, vec![Some(Duration::from_millis(10)), None]);
    assert_eq!(
        r.slow_recoveries,
        vec![1],
        "never acquired after the second heal"
    );
    let r = check(&h, Duration::from_millis(5));
    assert_eq!(r.slow_recoveries, vec![0, 1], "10 ms is over a 5 ms bound");

    // A window cut short by the next fault, before the bound, is not a slow recovery.
    h.faults.push(Fault {
        what: "c".into(),
        start: ms(2100),
        healed: ms(2200),
        ..Fault::default()
    });
    h.sections.push(section(4, 14, 2300, 3300, Some(2400)));
    let r = check(&h, BOUND);
    assert_eq!(
        r.reacquired,
        vec![
            Some(Duration::from_millis(10)),
            None,
            Some(Duration::from_millis(100))
        ]
    );
    assert!(r.slow_recoveries.is_empty(), "{:?}", r.slow_recoveries);
    assert_eq!(r.worst_reacquire(), Some(Duration::from_millis(100)));
}

#[test]
fn child_records_survive_the_trip_through_stdout() {
    let s = section(7, 42, 100, 1100, Some(500));
    let unreleased = section(8, 43, 600, 1600, None);
    let w = write(7, 42, 200, false);
    let op = Op {
        client: 3,
        kind: OpKind::Release,
        start: ms(1),
        end: ms(2),
        bound: Duration::from_millis(1800),
        outcome: "lost",
    };
    let line = |body: String| format!("{}{body}", crate::child::PREFIX);
    assert_eq!(decode(&line(encode_section(&s))), Some(Event::Section(s)));
    assert_eq!(
        decode(&line(encode_section(&unreleased))),
        Some(Event::Section(unreleased))
    );
    assert_eq!(decode(&line(encode_write(&w))), Some(Event::Write(w)));
    assert_eq!(decode(&line(encode_op(&op))), Some(Event::Op(op)));
    assert_eq!(decode("running 1 test"), None);
}

#[test]
fn a_fault_that_left_a_majority_must_see_acquisitions_during_it() {
    let fault = |start, healed, available_after| Fault {
        what: "f".into(),
        start: ms(start),
        healed: ms(healed),
        available_after,
    };
    let mut h = clean(); // acquisitions at 0, 120 and 310
    h.end = ms(12_000);
    h.faults = vec![
        // 1.5 s with a majority for everyone and nobody acquired: starved.
        fault(1600, 3100, Some(Duration::ZERO)),
        // The same, but nothing was promised (no client kept a majority).
        fault(3200, 4700, None),
        // Leftover keys may block the others for a ttl: 1.5 s is not enough to tell.
        fault(4800, 6300, Some(Duration::from_secs(1))),
        // ... 2.5 s is.
        fault(6400, 8900, Some(Duration::from_secs(1))),
        // Acquired during it: fine.
        fault(100, 1500, Some(Duration::ZERO)),
        // Two faults that overlap: each promised a majority on its own, but together they may
        // have cut one, so neither is judged.
        fault(9500, 11_000, Some(Duration::ZERO)),
        fault(10_000, 11_500, Some(Duration::ZERO)),
    ];
    let r = check(&h, Duration::from_secs(60));
    assert_eq!(r.during, vec![0, 0, 0, 0, 2, 0, 0]);
    assert_eq!(r.judged, vec![0, 3, 4]);
    assert_eq!(r.starved, vec![0, 3]);
    assert_eq!(r.violations(), 2, "{r:?}");

    // Attempts refused by a quorum holding the lock during the fault: contention (clients
    // keeping one another out), not unavailability.
    let refused = |start, end, outcome| Op {
        client: 2,
        kind: OpKind::Acquire,
        start: ms(start),
        end: ms(end),
        bound: Duration::from_secs(5),
        outcome,
    };
    h.ops = vec![
        refused(0, 2000, "held"),         // ends inside fault 0
        refused(6000, 9000, "held"),      // ends after fault 3 healed
        refused(6500, 8000, "no_quorum"), // unreachable is no excuse
    ];
    let r = check(&h, Duration::from_secs(60));
    assert_eq!((&r.contended, &r.starved), (&vec![0], &vec![3]), "{r:?}");
}

#[test]
fn harness_trouble_fails_the_run() {
    let mut h = clean();
    assert_eq!(check(&h, BOUND).violations(), 0);
    h.malformed.push("CHAOS section 1 2".into());
    h.incidents.push("client 0 did not stop".into());
    h.unfinished_writes.push(PendingWrite {
        session: 3,
        client: 3,
        token: 13,
        start: ms(500),
    });
    let r = check(&h, BOUND);
    assert_eq!(
        (r.malformed, r.incidents, r.unfinished_writes),
        (1, 1, 1),
        "{r:?}"
    );
    assert_eq!(r.violations(), 3);
}

#[test]
fn clock_jumps_count_only_when_they_hit_a_bare_majority_holder() {
    let jump = |targeted, hit_holder| ClockJump {
        node: 1,
        at: ms(10),
        targeted,
        hit_holder,
        keys: 2,
    };
    let mut h = clean();
    h.clock_jumps = vec![jump(false, false), jump(true, false), jump(true, true)];
    let r = check(&h, BOUND);
    assert_eq!((r.clock_jumps, r.jumps_fired), (3, 1));
}

/// A client stopped (or a child killed) inside a section: the snapshot keeps the section, so
/// the checker still sees its overlap.
#[test]
fn a_section_still_open_at_the_snapshot_is_judged() {
    let rec = Recorder::new();
    let open = |session, client, acquired, until| Section {
        session,
        client,
        token: session,
        acquired: ms(acquired),
        valid_until: ms(until),
        released: None,
    };
    rec.open(open(1, 0, 0, 1000));
    // Extended (by keep-alive, reported): valid until 3000 now.
    rec.extended(1, ms(3000));
    rec.open(open(2, 1, 2000, 3000));
    rec.section(Section {
        released: Some(ms(2100)),
        ..open(2, 1, 2000, 3000)
    });
    let h = rec.snapshot();
    assert_eq!(h.sections.len(), 2);
    let first = h.sections.iter().find(|s| s.session == 1).unwrap();
    assert_eq!((first.released, first.valid_until), (None, ms(3000)));
    assert_eq!(check(&h, BOUND).overlaps, vec![(1, 2)]);
    assert_eq!(rec.acquired_since(ms(0)), 2);
}

/// A killed child's open section is rebuilt from its last reported deadline and ends at its
/// death: an extended lease is not cut short at its first deadline.
#[test]
fn a_killed_childs_section_ends_at_its_death_with_its_last_deadline() {
    let rec = Recorder::new();
    rec.open(section(7, 7, 0, 1000, None));
    rec.extended(7, ms(1600));
    rec.extended(7, ms(2400));
    rec.open(section(8, 8, 100, 900, None)); // another client's, stays open
    rec.write_started(PendingWrite {
        session: 7,
        client: 7,
        token: 7,
        start: ms(1900),
    });
    assert_eq!(rec.close_open(7, ms(2000)), 1);
    assert_eq!(rec.pending_writes(7).len(), 1);
    // Another client acquires at 1500: inside the extended lease, after the first deadline.
    rec.section(section(9, 9, 1500, 2500, Some(1800)));
    let h = rec.snapshot();
    let s7 = h.sections.iter().find(|s| s.session == 7).unwrap();
    assert_eq!(
        (s7.valid_until, s7.released, s7.end()),
        (ms(2400), Some(ms(2000)), ms(2000))
    );
    assert_eq!(h.unfinished_writes.len(), 1);
    let r = check(&h, BOUND);
    assert!(r.overlaps.contains(&(7, 9)), "{:?}", r.overlaps);
    assert_eq!(r.unfinished_writes, 1);
}

#[test]
fn every_child_record_parses_and_anything_else_with_the_prefix_is_malformed() {
    let line = |body: &str| format!("{}{body}", crate::child::PREFIX);
    assert_eq!(
        classify(&line("extended 7 2400000000")),
        Line::Record(Event::Extended {
            session: 7,
            until: ms(2400)
        })
    );
    assert_eq!(
        classify(&line("lost 7 2500000000")),
        Line::Record(Event::Lost {
            session: 7,
            at: ms(2500)
        })
    );
    assert_eq!(
        classify(&line("writing 7 1 42 1900000000")),
        Line::Record(Event::Writing(PendingWrite {
            session: 7,
            client: 1,
            token: 42,
            start: ms(1900)
        }))
    );
    assert_eq!(classify(&line("done")), Line::Record(Event::Done));
    for bad in [
        "section 7 1 42 100",          // fields missing
        "write 7 42 1 2 1 extra",      // one too many
        "write 7 42 1 2 7",            // not a flag
        "op 1 acquire 1 2 3 exploded", // unknown outcome
        "acquired seven 1 2 3",        // not a number
        "teleported 7",                // unknown record
    ] {
        assert_eq!(classify(&line(bad)), Line::Malformed, "{bad}");
    }
    assert_eq!(
        classify(".CHAOS done"),
        Line::Malformed,
        "glued to libtest's output"
    );
    assert_eq!(classify("running 1 test"), Line::Other);
    assert_eq!(classify("test result: ok. 1 passed"), Line::Other);
}

#[test]
fn the_nemesis_knows_when_the_lock_must_stay_available() {
    use crate::nemesis::Fault as F;
    let ttl = Duration::from_secs(1);
    let s = Duration::from_secs(1);
    let after = |f: F| f.available_after(5, 3, ttl);
    let all = |nodes: &[usize]| -> Vec<(usize, usize)> {
        (0..3)
            .flat_map(|c| nodes.iter().map(move |&n| (c, n)))
            .collect()
    };
    // Node faults on a minority.
    let kill = |nodes: Vec<usize>, down| F::Kill { nodes, down };
    assert_eq!(after(kill(vec![0, 3], s)), Some(Duration::ZERO));
    assert_eq!(
        after(kill(vec![0, 3], Duration::ZERO)),
        None,
        "instantaneous"
    );
    assert_eq!(after(kill(vec![0, 1, 3], s)), None, "a majority");
    let pause = |nodes: Vec<usize>| F::PauseNodes { nodes, hold: s };
    assert_eq!(after(pause(vec![4])), Some(Duration::ZERO));
    assert_eq!(after(pause(vec![0, 2, 4])), None);
    // The same minority cut for every client, or different ones.
    let hole = |links| F::Blackhole { links, hold: s };
    assert_eq!(after(hole(all(&[1, 2]))), Some(Duration::ZERO));
    assert_eq!(
        after(hole(vec![(0, 0), (0, 1), (1, 2), (1, 3)])),
        Some(ttl),
        "leftover keys of a holder cut from one minority can block another client"
    );
    assert_eq!(after(hole(all(&[0, 1, 2]))), None);
    let views = |views| F::Partition { views, hold: s };
    assert_eq!(
        after(views(vec![vec![0, 1, 2], vec![2, 3, 4], vec![0]])),
        Some(ttl)
    );
    assert_eq!(after(views(vec![vec![0, 1], vec![3, 4], vec![2]])), None);
    let jump = F::ClockJump {
        client: 1,
        cut: vec![0, 4],
        node: 2,
        jump: s,
        hold: s,
    };
    assert_eq!(after(jump), Some(Duration::ZERO));
    assert_eq!(after(F::PauseClient { hold: s }), None);
}

/// Issue 12 item 6: inside a window where the refusals alone cannot rule out a quorum (a foreign
/// key on a minority, other nodes failed), an acquisition that ends as `held` misreports an
/// outage; one that ends as `no_quorum` is right, and one outside the window is not judged.
#[test]
fn held_inside_a_window_where_refusals_cannot_rule_out_a_quorum_is_a_violation() {
    let acquire = |start, end, outcome| Op {
        client: 0,
        kind: OpKind::Acquire,
        start: ms(start),
        end: ms(end),
        bound: Duration::from_secs(5),
        outcome,
    };
    let mut h = clean();
    h.held_impossible = vec![(ms(500), ms(900))];
    h.ops = vec![
        acquire(450, 600, "no_quorum"),
        acquire(600, 800, "held"),
        acquire(850, 1000, "held"),
    ];
    let r = check(&h, Duration::from_secs(1));
    assert_eq!(r.held_judged, vec![0, 1]);
    assert_eq!(r.misreported_held, vec![1]);
    assert_eq!(r.violations(), 1);
}

//! The simulator's fault modes, key handling, visibility lag and ground
//! truth, run on paused tokio time.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use verified_tools::sim::{
    ActivateCustomer, CustomerId, CustomerStatus, Effect, EffectCount, FaultDraw, FaultLevel,
    FaultProfile, InvoiceId, Lag, Op, Oracle, RecordId, RecordInvoice, RecordStatus, RowId,
    SimConfig, SimError, SimServer, StaleReads, Task, TaskKind, Timeout, TimeoutKind,
};
use verified_tools::{Classify, Deadline, ErrorClass, IdempotencyKey};

const C: CustomerId = CustomerId(7);
const ROW: RowId = RowId(3);
const REC: RecordId = RecordId(5);
const INV: InvoiceId = InvoiceId(1234);
const AMOUNT: u64 = 9_900;

fn key(n: u128) -> Option<IdempotencyKey> {
    Some(IdempotencyKey::from_u128(n))
}

/// `p` without late arrivals: a timed-out request that reached the server
/// was applied at once.
fn at_once(p: FaultProfile) -> FaultProfile {
    p.with_late_arrival(0.0, p.late_delay)
}

/// `p` with every lag drawn from the bulk (1..=`lag_time`), none from the tail.
fn bulk_lags(p: FaultProfile) -> FaultProfile {
    p.with_lag_tail(0.0, p.lag_tail_time)
}

fn server(profile: FaultProfile) -> (Arc<SimServer>, Oracle) {
    SimServer::new(SimConfig::new(42, profile))
}

/// A call whose answer is lost this way ([`Oracle::script`]).
fn lost(timeout: Timeout) -> FaultDraw {
    FaultDraw { timeout: Some(timeout), ..FaultDraw::default() }
}

/// A compound write that applies in part, and says so.
fn partial() -> FaultDraw {
    FaultDraw { partial: true, ..FaultDraw::default() }
}

/// A versioned write that a concurrent writer beats.
fn conflict() -> FaultDraw {
    FaultDraw { conflict: true, ..FaultDraw::default() }
}

/// A write that stays invisible to `reads` reads and for `ms` milliseconds.
fn lagged(reads: u32, ms: u64) -> FaultDraw {
    // Bounded as the profile's own lags are.
    let bound = FaultProfile::NONE.lag_bound();
    let lag = Lag { reads, time: Duration::from_millis(ms), bound };
    FaultDraw { lag: Some(lag), ..FaultDraw::default() }
}

/// A server with customer `C` already created, without faults on that call
/// whatever the profile.
async fn with_customer(cfg: SimConfig) -> (Arc<SimServer>, Oracle, u64) {
    let (s, o) = SimServer::new(cfg);
    o.script(Op::CreateCustomer, 0, FaultDraw::default());
    let c = s.create_customer(C, None, None).await.expect("no fault on create");
    (s, o, c.version)
}

// ---------------------------------------------------------------- timeouts

#[tokio::test(start_paused = true)]
async fn a_timeout_before_applying_leaves_no_effect_and_takes_the_timeout() {
    let p = FaultProfile { timeout: 1.0, ..FaultProfile::NONE }.with_timeout_applied_share(0.0);
    let (s, o) = server(p);
    let t0 = Instant::now();
    let err = s.create_customer(C, key(1), None).await.unwrap_err();
    assert_eq!(err, SimError::Timeout);
    assert_eq!(err.classify(), ErrorClass::Ambiguous);
    assert_eq!(t0.elapsed(), p.timeout_after);
    let truth = o.truth();
    assert_eq!(truth.customer(C), None);
    assert_eq!(truth.applied(Op::CreateCustomer, C.0).applied, 0);
    assert_eq!(truth.faults().timeouts_before_applying, 1);
}

#[tokio::test(start_paused = true)]
async fn a_timeout_after_applying_leaves_the_effect() {
    let p = at_once(FaultProfile { timeout: 1.0, ..FaultProfile::NONE });
    assert_eq!(p.timeout_kind, TimeoutKind::AfterDispatch, "the paper's, by default");
    let (s, o) = server(p);
    assert_eq!(s.create_customer(C, None, None).await, Err(SimError::Timeout));
    let truth = o.truth();
    assert_eq!(truth.customer(C).map(|c| c.status), Some(CustomerStatus::Pending));
    assert_eq!(truth.applied(Op::CreateCustomer, C.0).applied, 1);
    assert_eq!(truth.faults().timeouts_after_applying, 1);
}

#[tokio::test(start_paused = true)]
async fn every_timeout_reaches_the_server_at_once_or_late_by_default() {
    let p = FaultProfile { timeout: 1.0, ..FaultProfile::NONE };
    // Every call times out; the creation is applied at once.
    let (s, o) = server(p);
    o.script(Op::CreateCustomer, 0, lost(Timeout::AfterApplying));
    assert_eq!(s.create_customer(C, None, None).await, Err(SimError::Timeout));
    let t0 = Instant::now();
    for _ in 0..2_000 {
        assert_eq!(s.send_welcome(C, None, None).await, Err(SimError::Timeout));
    }
    assert_eq!(t0.elapsed(), p.timeout_after * 2_000);
    let truth = o.truth();
    let f = truth.faults();
    // None lost before the server; about half received late (the configured
    // late-arrival share), the rest applied at once.
    assert_eq!(f.timeouts_before_applying, 0);
    assert_eq!(f.timeouts_after_applying + f.late_arrivals, 2_001);
    assert!((900..=1_100).contains(&f.late_arrivals), "{f:?}");
    // The late ones that are due have landed; the rest are on their way.
    let landed = truth.welcome_messages(C);
    assert!(landed > f.timeouts_after_applying - 1, "some late arrivals landed");
    assert_eq!(landed as usize + o.in_flight(), 2_000);
    // Eventually every request is applied: the server received them all.
    let quiet = o.quiet_at();
    let fin = o.final_truth().await;
    assert_eq!(quiet.map(|_| Instant::now()), quiet);
    assert_eq!(fin.welcome_messages(C), 2_000);
    assert_eq!(o.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_earlier_split_before_or_after_applying_is_an_option() {
    let p = FaultProfile { timeout: 1.0, ..FaultProfile::NONE }.legacy();
    assert_eq!(p.timeout_kind, TimeoutKind::BeforeOrAfter { applied_share: 0.5 });
    let (s, o) = server(p);
    o.script(Op::CreateCustomer, 0, lost(Timeout::AfterApplying));
    assert_eq!(s.create_customer(C, None, None).await, Err(SimError::Timeout));
    for _ in 0..2_000 {
        assert_eq!(s.send_welcome(C, None, None).await, Err(SimError::Timeout));
    }
    let truth = o.truth();
    let f = truth.faults();
    assert_eq!(f.timeouts_before_applying + f.timeouts_after_applying, 2_001);
    assert_eq!(f.late_arrivals, 0);
    // Each send that timed out after applying left a message; about half did.
    assert_eq!(truth.welcome_messages(C) + 1, f.timeouts_after_applying);
    assert!((900..=1_100).contains(&f.timeouts_after_applying), "{f:?}");
    assert_eq!(o.in_flight(), 0);
}

// ---------------------------------------------------------------- late arrivals and deadlines

/// How late the first send of the late-arrival tests reaches the server:
/// after the retry at 1.2 s.
const LATE: Duration = Duration::from_millis(2_500);

#[tokio::test(start_paused = true)]
async fn a_late_arrival_lands_after_the_retry_and_duplicates_only_without_keys() {
    let retry_at = Duration::from_millis(1_200);
    let delay = LATE;
    for honour in [true, false] {
        let cfg = SimConfig::new(42, FaultProfile::NONE).with_honour_keys(honour);
        let (s, o, _) = with_customer(cfg).await;
        o.script(Op::SendWelcome, 0, lost(Timeout::Late(delay)));
        let t0 = Instant::now();
        // No deadline sent: nothing stops the late request.
        assert_eq!(s.send_welcome(C, key(5), None).await, Err(SimError::Timeout));
        assert_eq!(o.truth().welcome_messages(C), 0, "not received yet");
        assert_eq!(o.in_flight(), 1);
        tokio::time::sleep_until(t0 + retry_at).await;
        let retry = s.send_welcome(C, key(5), None).await.unwrap();
        assert_eq!(retry.id.0, 0, "the retry is applied first");
        assert_eq!(o.truth().welcome_messages(C), 1);
        // The first request lands `delay` after it was sent, after the retry.
        assert_eq!(o.quiet_at(), Some(t0 + delay));
        let fin = o.final_truth().await;
        assert_eq!(fin.faults().late_arrivals, 1);
        if honour {
            // The retry stored the key: the late request is a replay.
            assert_eq!(fin.welcome_messages(C), 1);
            assert!(!fin.has_duplicates());
        } else {
            assert_eq!(fin.welcome_messages(C), 2);
            assert_eq!(fin.outbox()[1].key, key(5), "the late one, landed second");
            assert!(fin.has_duplicates());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_deadline_honouring_server_drops_a_late_request_past_its_deadline() {
    let delay = LATE;
    for honour_deadlines in [true, false] {
        // Keys ignored: only the deadline can stop the duplicate.
        let cfg = SimConfig::new(42, FaultProfile::NONE).with_honour_keys(false);
        let (s, o, _) = with_customer(cfg.with_honour_deadlines(honour_deadlines)).await;
        o.script(Op::SendWelcome, 0, lost(Timeout::Late(delay)));
        let t0 = Instant::now();
        let deadline = Deadline::after(Duration::from_secs(1));
        assert_eq!(s.send_welcome(C, key(5), Some(deadline)).await, Err(SimError::Timeout));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let retry = Deadline::after(Duration::from_secs(1));
        s.send_welcome(C, key(5), Some(retry)).await.unwrap();
        let fin = o.final_truth().await;
        assert_eq!(Instant::now(), t0 + delay);
        let f = fin.faults();
        if honour_deadlines {
            assert_eq!(fin.welcome_messages(C), 1);
            assert_eq!(f.dropped_past_deadline, 1);
            assert!(!fin.has_duplicates());
        } else {
            assert_eq!(fin.welcome_messages(C), 2);
            assert_eq!(f.dropped_past_deadline, 0);
        }
    }
    // A request that reaches the server past its deadline at once is
    // answered, definitively.
    let (s, o, _) = with_customer(SimConfig::new(42, FaultProfile::NONE)).await;
    let passed = Deadline::at(Instant::now());
    tokio::time::sleep(Duration::from_millis(1)).await;
    let err = s.send_welcome(C, None, Some(passed)).await.unwrap_err();
    assert_eq!((err, err.classify()), (SimError::DeadlineExceeded, ErrorClass::Definitive));
    assert_eq!(o.truth().welcome_messages(C), 0);
    // At its deadline exactly, it is still applied.
    let now = Deadline::at(Instant::now());
    s.send_welcome(C, None, Some(now)).await.unwrap();
    assert_eq!(o.truth().welcome_messages(C), 1);
}

#[tokio::test(start_paused = true)]
async fn with_deadlines_honoured_nothing_lands_after_the_deadline() {
    // Many late arrivals: on a deadline-honouring server each one lands by
    // its deadline or never, and the dropped share is the delay's tail past
    // the deadline; ignoring deadlines, all of them land, some much later.
    let p = FaultProfile { timeout: 1.0, ..FaultProfile::NONE };
    let limit = Duration::from_secs(1);
    for honour in [true, false] {
        let cfg = SimConfig::new(7, p).with_honour_deadlines(honour);
        let (s, o) = SimServer::new(cfg);
        // Every call times out; the creation lands, at once or late.
        assert_eq!(s.create_customer(C, None, None).await, Err(SimError::Timeout));
        assert!(o.final_truth().await.customer(C).is_some());
        let mut last_deadline = Instant::now();
        for _ in 0..4_000 {
            let deadline = Deadline::after(limit);
            last_deadline = deadline.instant();
            let _ = s.send_welcome(C, None, Some(deadline)).await;
        }
        assert!(Instant::now() >= last_deadline);
        let at_deadline = o.truth();
        let fin = o.final_truth().await;
        let f = fin.faults();
        let late = f64::from(f.late_arrivals);
        assert!(late > 1_500.0, "{f:?}");
        if honour {
            // P(delay > 1 s) = (0.1 s / 1 s)^1 = 10% of the late arrivals.
            let dropped = f64::from(f.dropped_past_deadline) / late;
            assert!((dropped - 0.1).abs() < 0.03, "{dropped}");
            // Past the last deadline, nothing more was applied.
            assert_eq!(fin.welcome_messages(C), at_deadline.welcome_messages(C));
            assert_eq!(
                fin.welcome_messages(C) + f.dropped_past_deadline,
                4_000,
                "every request was applied or dropped"
            );
        } else {
            assert_eq!(f.dropped_past_deadline, 0);
            assert_eq!(fin.welcome_messages(C), 4_000);
            assert!(fin.welcome_messages(C) > at_deadline.welcome_messages(C), "landed later");
        }
    }
}

// ---------------------------------------------------------------- keys

#[tokio::test(start_paused = true)]
async fn a_repeated_key_applies_nothing_and_answers_as_the_first() {
    let (s, o, _) = with_customer(SimConfig::new(42, FaultProfile::NONE)).await;
    let first = s.send_welcome(C, key(9), None).await.unwrap();
    let again = s.send_welcome(C, key(9), None).await.unwrap();
    assert_eq!(first, again);
    let truth = o.truth();
    assert_eq!(truth.welcome_messages(C), 1);
    assert_eq!(truth.applied(Op::SendWelcome, C.0).applied, 1);
    assert!(!truth.has_duplicates());
    assert_eq!(truth.calls(Op::SendWelcome), 2);
    // Another key is another send.
    s.send_welcome(C, key(10), None).await.unwrap();
    assert_eq!(o.truth().welcome_messages(C), 2);
    assert!(o.truth().has_duplicates());
}

#[tokio::test(start_paused = true)]
async fn keys_are_ignored_when_switched_off() {
    let cfg = SimConfig::new(42, FaultProfile::NONE).with_honour_keys(false);
    let (s, o, _) = with_customer(cfg).await;
    let first = s.send_welcome(C, key(9), None).await.unwrap();
    let again = s.send_welcome(C, key(9), None).await.unwrap();
    assert_ne!(first.id, again.id);
    let truth = o.truth();
    assert_eq!(truth.welcome_messages(C), 2);
    assert!(truth.has_duplicates());
}

#[tokio::test(start_paused = true)]
async fn a_key_reused_for_another_request_is_refused() {
    let (s, o, v) = with_customer(SimConfig::new(42, FaultProfile::NONE)).await;
    s.send_welcome(C, key(1), None).await.unwrap();
    let err = s.send_welcome(CustomerId(8), key(1), None).await.unwrap_err();
    assert_eq!(err, SimError::KeyReuse);
    assert_eq!(err.classify(), ErrorClass::Definitive);
    let err = s.set_customer_status(C, CustomerStatus::Active, v, key(1), None).await.unwrap_err();
    assert_eq!(err, SimError::KeyReuse);
    assert_eq!(o.truth().customer(C).unwrap().status, CustomerStatus::Pending);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_an_applied_timeout_is_deduplicated_only_with_keys() {
    let p = FaultLevel::High.profile();
    // Call 0 of the send times out after applying; call 1 goes through.
    for honour in [true, false] {
        let cfg = SimConfig::new(42, p).with_honour_keys(honour);
        let (s, o, _) = with_customer(cfg).await;
        o.script(Op::SendWelcome, 0, lost(Timeout::AfterApplying));
        o.script(Op::SendWelcome, 1, FaultDraw::default());
        assert_eq!(s.send_welcome(C, key(5), None).await, Err(SimError::Timeout));
        let retry = s.send_welcome(C, key(5), None).await.unwrap();
        let truth = o.truth();
        assert_eq!(retry.id.0, if honour { 0 } else { 1 });
        assert_eq!(truth.welcome_messages(C), if honour { 1 } else { 2 });
        assert_eq!(truth.has_duplicates(), !honour);
    }
}

// ---------------------------------------------------------------- partial success

#[tokio::test(start_paused = true)]
async fn partial_success_answers_ok_and_leaves_activate_customer_false() {
    let p = FaultProfile { partial_success: 1.0, ..FaultProfile::NONE };
    let (s, o) = server(p);
    let c = s.create_customer(C, None, None).await.unwrap(); // not compound: complete
    let c =
        s.set_customer_status(c.id, CustomerStatus::Active, c.version, None, None).await.unwrap();
    assert_eq!((c.status, c.activated_at), (CustomerStatus::Active, None)); // OK, with partial data
    s.send_welcome(C, None, None).await.unwrap(); // not compound: complete
    let truth = o.truth();
    assert_eq!(truth.customer(C).unwrap().activated_at, None);
    assert_eq!(truth.welcome_messages(C), 1);
    assert!(!ActivateCustomer { customer: C }.holds(&truth));
    assert_eq!(truth.faults().partial, 1);
    assert_eq!(truth.applied(Op::SetCustomerStatus, C.0).partial, 1);
}

#[tokio::test(start_paused = true)]
async fn partial_success_answers_ok_and_leaves_record_invoice_false() {
    let p = FaultProfile { partial_success: 1.0, ..FaultProfile::NONE };
    let (s, o) = server(p);
    let row = s.update_invoice_row(ROW, INV, AMOUNT, None, None).await.unwrap();
    assert_eq!((row.invoice_id, row.amount), (Some(INV), None));
    let r = s.create_record(REC, INV, AMOUNT, None, None).await.unwrap();
    assert_eq!((r.invoice_id, r.amount), (None, None));
    let r = s.set_record_status(REC, RecordStatus::Recorded, r.version, None, None).await.unwrap();
    assert_eq!(r.status, RecordStatus::Recorded); // not compound: complete
    let task = RecordInvoice { row: ROW, invoice_id: INV, amount: AMOUNT, record: REC };
    let truth = o.truth();
    assert!(truth.invoice_row(ROW).is_some() && truth.record(REC).is_some());
    assert!(!task.holds(&truth));
    assert_eq!(truth.faults().partial, 2);
}

#[tokio::test(start_paused = true)]
async fn completing_a_partial_update_is_not_a_duplicate_but_a_second_full_one_is() {
    // Call 0 is partial; the others are full.
    let (s, o) = server(FaultProfile::NONE);
    o.script(Op::UpdateInvoiceRow, 0, partial());
    assert_eq!(s.update_invoice_row(ROW, INV, AMOUNT, None, None).await.unwrap().amount, None);
    // A retry with the same key replays the partial answer and repairs nothing.
    let (s2, o2) = server(FaultProfile::NONE);
    o2.script(Op::UpdateInvoiceRow, 0, partial());
    s2.update_invoice_row(ROW, INV, AMOUNT, key(3), None).await.unwrap();
    assert_eq!(s2.update_invoice_row(ROW, INV, AMOUNT, key(3), None).await.unwrap().amount, None);
    assert_eq!(o2.truth().applied(Op::UpdateInvoiceRow, ROW.0).applied, 1);
    // A repair (new write) completes it: one full application, no duplicate.
    s.update_invoice_row(ROW, INV, AMOUNT, None, None).await.unwrap();
    let truth = o.truth();
    assert_eq!(truth.invoice_row(ROW).unwrap().amount, Some(AMOUNT));
    assert_eq!(truth.applied(Op::UpdateInvoiceRow, ROW.0).full(), 1);
    assert!(!truth.has_duplicates());
    // A second full write is a duplicate write.
    s.update_invoice_row(ROW, INV, AMOUNT, None, None).await.unwrap();
    let dups: Vec<_> = o.truth().duplicates().collect();
    assert_eq!(dups.len(), 1);
    assert_eq!((dups[0].0.op, dups[0].1.applied, dups[0].1.partial), (Op::UpdateInvoiceRow, 3, 1));
}

// ---------------------------------------------------------------- partial OK

/// Only partial OKs: every compound write applies in part and answers as if
/// it had applied in full.
fn partial_oks() -> FaultProfile {
    FaultProfile::NONE.with_partial_ok(1.0)
}

#[tokio::test(start_paused = true)]
async fn a_partial_ok_answers_as_a_full_write_and_leaves_activate_customer_false() {
    let (s, o) = server(partial_oks());
    let c = s.create_customer(C, None, None).await.unwrap(); // not compound: complete
    let c =
        s.set_customer_status(c.id, CustomerStatus::Active, c.version, None, None).await.unwrap();
    // The answer says ACTIVE since now; the server stored no activated_at.
    assert_eq!((c.status, c.activated_at), (CustomerStatus::Active, Some(0)));
    assert_eq!(c.version, 2);
    s.send_welcome(C, None, None).await.unwrap();
    let truth = o.truth();
    let stored = truth.customer(C).unwrap();
    assert_eq!((stored.status, stored.activated_at, stored.version), (c.status, None, c.version));
    assert!(!ActivateCustomer { customer: C }.holds(&truth));
    // A read (a verifier's) sees what was stored, not what was answered.
    assert_eq!(s.get_customer(C).await.unwrap().unwrap().activated_at, None);
    let f = truth.faults();
    assert_eq!((f.partial, f.partial_ok), (1, 1));
    assert_eq!(truth.applied(Op::SetCustomerStatus, C.0).partial, 1);
}

#[tokio::test(start_paused = true)]
async fn a_partial_ok_answers_as_a_full_write_and_leaves_record_invoice_false() {
    let (s, o) = server(partial_oks());
    let row = s.update_invoice_row(ROW, INV, AMOUNT, None, None).await.unwrap();
    assert_eq!((row.invoice_id, row.amount), (Some(INV), Some(AMOUNT)));
    let r = s.create_record(REC, INV, AMOUNT, None, None).await.unwrap();
    assert_eq!((r.invoice_id, r.amount, r.version), (Some(INV), Some(AMOUNT), 1));
    let r = s.set_record_status(REC, RecordStatus::Recorded, r.version, None, None).await.unwrap();
    assert_eq!(r.status, RecordStatus::Recorded); // not compound: complete, as stored
    assert_eq!((r.invoice_id, r.amount), (None, None));
    let task = RecordInvoice { row: ROW, invoice_id: INV, amount: AMOUNT, record: REC };
    let truth = o.truth();
    assert_eq!(truth.invoice_row(ROW).unwrap().amount, None);
    assert!(!task.holds(&truth));
    // The repair is compound too: it answers with the amount, stores none.
    let r = s.update_record_fields(REC, INV, AMOUNT, r.version, None, None).await.unwrap();
    assert_eq!((r.invoice_id, r.amount, r.version), (Some(INV), Some(AMOUNT), 3));
    let stored = o.truth().record(REC).unwrap();
    assert_eq!((stored.invoice_id, stored.amount, stored.version), (Some(INV), None, 3));
    let f = o.truth().faults();
    assert_eq!((f.partial, f.partial_ok), (3, 3));
}

#[tokio::test(start_paused = true)]
async fn a_repeated_key_replays_the_partial_ok_answer() {
    let (s, o) = server(partial_oks());
    let first = s.create_record(REC, INV, AMOUNT, key(9), None).await.unwrap();
    let again = s.create_record(REC, INV, AMOUNT, key(9), None).await.unwrap();
    assert_eq!(again, first, "the stored answer, full-looking, not the record");
    assert_eq!((again.invoice_id, again.amount), (Some(INV), Some(AMOUNT)));
    let truth = o.truth();
    assert_eq!(truth.applied(Op::CreateRecord, REC.0).applied, 1);
    assert_eq!(truth.record(REC).map(|r| r.amount), Some(None));
}

#[tokio::test(start_paused = true)]
async fn a_partial_ok_drawn_with_a_partial_success_answers_as_a_full_write() {
    let both = FaultProfile { partial_success: 1.0, ..partial_oks() };
    let (s, o) = server(both);
    let row = s.update_invoice_row(ROW, INV, AMOUNT, None, None).await.unwrap();
    assert_eq!(row.amount, Some(AMOUNT));
    let truth = o.truth();
    assert_eq!(truth.invoice_row(ROW).unwrap().amount, None);
    assert_eq!((truth.faults().partial, truth.faults().partial_ok), (1, 1));
    // A partial success alone answers with what it wrote.
    let (s, o) = server(FaultProfile { partial_success: 1.0, ..FaultProfile::NONE });
    assert_eq!(s.update_invoice_row(ROW, INV, AMOUNT, None, None).await.unwrap().amount, None);
    assert_eq!((o.truth().faults().partial, o.truth().faults().partial_ok), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn partial_oks_occur_at_their_rate_and_only_on_compound_writes() {
    const CALLS: u32 = 10_000;
    let level = FaultLevel::High;
    let p = FaultProfile::NONE.with_partial_ok(level.partial_ok_rate());
    let (s, o) = server(p);
    let c = s.create_customer(C, None, None).await.unwrap();
    let (mut stored_partial, mut sends) = (0, 0);
    for n in 0..CALLS {
        let row = RowId(u64::from(n));
        let answer = s.update_invoice_row(row, INV, AMOUNT, None, None).await.unwrap();
        assert_eq!(answer.amount, Some(AMOUNT), "every answer looks complete");
        stored_partial += u32::from(o.truth().invoice_row(row).unwrap().amount.is_none());
        sends += u32::from(s.send_welcome(c.id, None, None).await.is_ok());
    }
    let f = o.truth().faults();
    assert_eq!((f.partial, f.partial_ok), (stored_partial, stored_partial));
    // 4 standard errors of 10,000 draws at 0.15: 0.0143.
    let share = f64::from(stored_partial) / f64::from(CALLS);
    assert!((share - 0.15).abs() < 0.0143, "{share}");
    // Sends are not compound: every one applied in full, none counted.
    assert_eq!((sends, o.truth().welcome_messages(C)), (CALLS, CALLS));
}

// ---------------------------------------------------------------- conflicts

#[tokio::test(start_paused = true)]
async fn a_conflict_bumps_the_version_and_rejects_the_write() {
    let (s, o, v) = with_customer(SimConfig::new(42, FaultProfile::NONE)).await;
    o.script(Op::SetCustomerStatus, 0, conflict());
    assert_eq!(v, 1);
    let err = s.set_customer_status(C, CustomerStatus::Active, v, key(1), None).await.unwrap_err();
    assert_eq!(err, SimError::Conflict { expected: 1, actual: 2 });
    assert_eq!(err.classify(), ErrorClass::Conflict);
    let truth = o.truth();
    let c = truth.customer(C).unwrap();
    assert_eq!((c.version, c.status), (2, CustomerStatus::Pending));
    assert_eq!(truth.faults().conflicts, 1);
    assert_eq!(truth.applied(Op::SetCustomerStatus, C.0).applied, 0);
    // The rejected call stored no key: re-read the version, retry with the same key.
    let fresh = s.get_customer(C).await.unwrap().unwrap();
    let c = s
        .set_customer_status(C, CustomerStatus::Active, fresh.version, key(1), None)
        .await
        .unwrap();
    assert_eq!((c.version, c.status), (3, CustomerStatus::Active));
    assert!(c.activated_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn versioned_writes_reject_a_stale_version_without_any_fault() {
    let (s, o) = server(FaultProfile::NONE);
    let r = s.create_record(REC, INV, AMOUNT, None, None).await.unwrap();
    s.set_record_status(REC, RecordStatus::Recorded, r.version, None, None).await.unwrap();
    // A blind retry of the same write carries the now stale version.
    let err =
        s.set_record_status(REC, RecordStatus::Recorded, r.version, None, None).await.unwrap_err();
    assert_eq!(err, SimError::Conflict { expected: 1, actual: 2 });
    assert_eq!(o.truth().applied(Op::SetRecordStatus, REC.0).applied, 1);
    assert_eq!(
        s.set_record_status(RecordId(99), RecordStatus::Recorded, 1, None, None).await,
        Err(SimError::NotFound)
    );
}

// ---------------------------------------------------------------- delayed visibility

#[tokio::test(start_paused = true)]
async fn stale_reads_end_after_the_read_lag_and_the_time_lag() {
    let p = FaultProfile { delayed_visibility: 1.0, ..FaultProfile::NONE }
        .with_lag(3, Duration::from_millis(400));
    let (s, o) = server(p);
    let lag = p.draw(42, Op::CreateCustomer, 0).lag.unwrap();
    let t0 = Instant::now();
    s.create_customer(C, None, None).await.unwrap();
    assert!(o.truth().customer(C).is_some(), "the primary has it");
    for _ in 0..lag.reads {
        assert_eq!(s.get_customer(C).await, Ok(None), "stale: the creation is hidden");
    }
    if t0.elapsed() < lag.time {
        assert_eq!(s.get_customer(C).await, Ok(None), "reads are used up, the time is not");
        tokio::time::sleep_until(t0 + lag.time).await;
    }
    assert_eq!(s.get_customer(C).await.unwrap().map(|c| c.version), Some(1));
    assert_eq!(o.truth().faults().delayed, 1);
}

#[tokio::test(start_paused = true)]
async fn a_delayed_update_shows_the_previous_state_then_the_new_one() {
    let (s, o, v) = with_customer(SimConfig::new(42, FaultProfile::NONE)).await;
    o.script(Op::SetCustomerStatus, 0, lagged(2, 300));
    s.set_customer_status(C, CustomerStatus::Active, v, None, None).await.unwrap();
    let seen = s.get_customer(C).await.unwrap().unwrap();
    assert_eq!((seen.status, seen.version), (CustomerStatus::Pending, 1));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = s.get_customer(C).await; // the lag's second read
    let seen = s.get_customer(C).await.unwrap().unwrap();
    assert_eq!((seen.status, seen.version), (CustomerStatus::Active, 2));
}

#[tokio::test(start_paused = true)]
async fn a_delayed_send_fools_a_naive_verifier_into_a_duplicate_without_keys() {
    // Every write is delayed; the first send's answer is lost as well.
    let p = FaultProfile { delayed_visibility: 1.0, ..FaultProfile::NONE };
    for honour in [true, false] {
        let cfg = SimConfig::new(42, p).with_honour_keys(honour);
        let (s, o) = SimServer::new(cfg);
        let lost_and_lagged =
            FaultDraw { lag: lagged(2, 1_000).lag, ..lost(Timeout::AfterApplying) };
        o.script(Op::SendWelcome, 0, lost_and_lagged);
        s.create_customer(C, None, None).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await; // let the customer show
        let _ = s.get_customer(C).await;
        let _ = s.get_customer(C).await;
        assert_eq!(s.send_welcome(C, key(4), None).await, Err(SimError::Timeout));
        // The naive verifier reads at once and sees no message: a false negative.
        assert_eq!(s.count_messages(C).await, Ok(0));
        s.send_welcome(C, key(4), None).await.unwrap();
        let truth = o.truth();
        assert_eq!(truth.welcome_messages(C), if honour { 1 } else { 2 });
    }
}

#[tokio::test(start_paused = true)]
async fn flagged_stale_reads_fail_instead_of_lying() {
    let p = bulk_lags(FaultProfile { delayed_visibility: 1.0, ..FaultProfile::NONE })
        .with_lag(1, Duration::ZERO);
    let cfg = SimConfig::new(42, p).with_stale_reads(StaleReads::Flagged);
    let (s, _o) = SimServer::new(cfg);
    s.create_customer(C, None, None).await.unwrap();
    let err = s.get_customer(C).await.unwrap_err();
    assert_eq!(err, SimError::StaleRead);
    assert_eq!(err.classify(), ErrorClass::Ambiguous);
    assert!(s.get_customer(C).await.unwrap().is_some());
    s.send_welcome(C, None, None).await.unwrap();
    assert_eq!(s.messages(C).await, Err(SimError::StaleRead));
    assert_eq!(s.messages(C).await.unwrap().len(), 1);
}

// ---------------------------------------------------------------- rates on the server

#[tokio::test(start_paused = true)]
async fn fault_modes_occur_at_their_rates_over_many_episodes() {
    const EPISODES: u32 = 10_000;
    for level in [FaultLevel::Medium, FaultLevel::Extreme] {
        let p = level.profile();
        let (mut timeouts, mut late, mut applied, mut delayed) = (0, 0, 0, 0);
        let (mut rows, mut partial, mut conflicts) = (0, 0, 0);
        for e in 0..EPISODES {
            let (s, o) = SimServer::new(SimConfig::new(1_000 + u64::from(e), p));
            // Customer and record exist on the primary whatever the faults.
            while s.create_customer(C, None, None).await.is_err() {}
            while s.create_record(REC, INV, AMOUNT, None, None).await.is_err() {}
            // One call of each measured operation.
            let f0 = o.truth().faults();
            let sent = s.send_welcome(C, None, None).await;
            let f1 = o.truth().faults();
            let _ = s.update_invoice_row(ROW, INV, AMOUNT, None, None).await;
            let version = o.truth().record(REC).unwrap().version;
            let _ = s.set_record_status(REC, RecordStatus::Recorded, version, None, None).await;
            timeouts += u32::from(sent == Err(SimError::Timeout));
            late += f1.late_arrivals - f0.late_arrivals;
            // Once the late arrivals have landed: every request reached the
            // server (timeouts after dispatch, no deadlines), so the send
            // was applied, at once or late.
            let truth = o.final_truth().await;
            assert_eq!(truth.applied(Op::SendWelcome, C.0).applied, 1);
            // Every applied write draws its lag independently.
            applied += truth.effects().iter().map(|(_, c)| c.applied).sum::<u32>();
            delayed += truth.faults().delayed;
            let row = truth.applied(Op::UpdateInvoiceRow, ROW.0);
            rows += row.applied;
            partial += row.partial;
            conflicts += truth.faults().conflicts;
        }
        // Within 4 standard errors of the configured probability.
        let near = |k: u32, n: u32, want: f64, what: &str| {
            let got = f64::from(k) / f64::from(n);
            let tol = 4.0 * (want * (1.0 - want) / f64::from(n)).sqrt();
            assert!(
                (got - want).abs() < tol,
                "{level} {what}: {k}/{n} = {got:.4}, want {want} ± {tol:.4}"
            );
        };
        near(timeouts, EPISODES, p.timeout, "timeouts");
        near(late, timeouts, p.late_arrival, "late arrivals among timeouts");
        near(delayed, applied, p.delayed_visibility, "delayed visibility");
        near(partial, rows, p.partial_success, "partial success");
        near(conflicts, EPISODES, p.conflict, "conflicts");
    }
}

#[tokio::test(start_paused = true)]
async fn the_replica_lag_has_a_heavy_tail_within_its_bound() {
    // Every creation delayed; poll each every 50 ms until it shows, and
    // measure how long it stayed hidden.
    let p = FaultProfile { delayed_visibility: 1.0, ..FaultProfile::NONE };
    let bound = p.lag_bound().expect("bounded by default");
    let step = Duration::from_millis(50);
    let mut hidden = Vec::new();
    for e in 0..3_000u64 {
        let (s, _o) = SimServer::new(SimConfig::new(e, p));
        s.create_customer(C, None, None).await.unwrap();
        let t0 = Instant::now();
        while s.get_customer(C).await.unwrap().is_none() {
            tokio::time::sleep(step).await;
        }
        hidden.push(t0.elapsed());
    }
    let n = hidden.len() as f64;
    let share = |d: Duration| hidden.iter().filter(|h| **h > d).count() as f64 / n;
    let bulk = p.lag_time;
    // The bulk ends at 1 s (a poll later at most); one lag in ten comes
    // from the Pareto tail, and some exceed 3 times the bulk's longest.
    assert!((share(bulk + step) - 0.1).abs() < 0.025, "{}", share(bulk + step));
    assert!(share(3 * bulk) > 0.003, "{}", share(3 * bulk));
    let longest = hidden.iter().max().copied().unwrap_or_default();
    assert!(longest > 4 * bulk, "{longest:?}");
    // ... and none beyond the bound (plus one poll).
    assert!(longest <= bound + step, "{longest:?}");
}

// ---------------------------------------------------------------- determinism

/// A blind-retry agent: every write retried once on error, no keys.
async fn blind_episode(cfg: SimConfig, task: Task, verify_reads: u32) -> (Vec<String>, Oracle) {
    let (s, o) = SimServer::new(cfg);
    let mut log = Vec::new();
    for attempt in 0..2 {
        for _ in 0..verify_reads {
            let _ = s.get_customer(C).await;
            let _ = s.count_messages(C).await;
            let _ = s.get_record(REC).await;
        }
        match task {
            Task::ActivateCustomer(t) => {
                let c = s.create_customer(t.customer, None, None).await;
                log.push(format!("{attempt} create {c:?}"));
                let v = o.truth().customer(t.customer).map_or(1, |c| c.version);
                let r =
                    s.set_customer_status(t.customer, CustomerStatus::Active, v, None, None).await;
                log.push(format!("{attempt} status {r:?}"));
                let m = s.send_welcome(t.customer, None, None).await;
                log.push(format!("{attempt} send {m:?}"));
            }
            Task::RecordInvoice(t) => {
                let r = s.update_invoice_row(t.row, t.invoice_id, t.amount, None, None).await;
                log.push(format!("{attempt} row {r:?}"));
                let r = s.create_record(t.record, t.invoice_id, t.amount, None, None).await;
                log.push(format!("{attempt} record {r:?}"));
                let v = o.truth().record(t.record).map_or(1, |r| r.version);
                let r = s.set_record_status(t.record, RecordStatus::Recorded, v, None, None).await;
                log.push(format!("{attempt} recorded {r:?}"));
            }
        }
    }
    (log, o)
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_gives_the_same_fault_stream_whatever_the_reads() {
    let p = FaultLevel::Extreme.profile();
    let mut differ = 0;
    for e in 0..50 {
        for kind in TaskKind::ALL {
            let seed = 42 + e;
            let task = kind.instance(seed);
            let (a, oa) = blind_episode(SimConfig::new(seed, p), task, 0).await;
            // Another method: many verifier reads in between, same faults.
            let (b, ob) = blind_episode(SimConfig::new(seed, p), task, 3).await;
            // Once every late arrival has landed (episode `a`'s would land
            // while `b` runs).
            let (ta, tb) = (oa.final_truth().await, ob.final_truth().await);
            assert_eq!(ta.effects(), tb.effects(), "episode {e} {kind}");
            assert_eq!(ta.faults(), tb.faults());
            assert_eq!(task.holds(&ta), task.holds(&tb));
            let strip = |v: &[String]| {
                v.iter().map(|l| l.replace(|c: char| c.is_ascii_digit(), "")).collect::<Vec<_>>()
            };
            assert_eq!(strip(&a), strip(&b));
            let (c, _) = blind_episode(SimConfig::new(seed + 1_000, p), task, 0).await;
            differ += usize::from(a != c);
        }
    }
    assert!(differ > 50, "other seeds give other streams ({differ}/100 differ)");
}

#[tokio::test(start_paused = true)]
async fn the_same_seed_replays_identically_in_virtual_time() {
    let mut late = 0;
    for seed in 45..85 {
        let cfg = SimConfig::new(seed, FaultLevel::Extreme.profile())
            .with_latency(Duration::from_millis(20));
        let task = TaskKind::ALL[seed as usize % 2].instance(seed);
        let run = || async {
            let t0 = Instant::now();
            let (log, o) = blind_episode(cfg, task, 1).await;
            let took = t0.elapsed();
            let landing = o.quiet_at().map(|at| at - t0);
            let truth = o.final_truth().await;
            (log, took, landing, truth)
        };
        let (a, b) = (run().await, run().await);
        assert_eq!((&a.0, a.1, a.2), (&b.0, b.1, b.2), "seed {seed}");
        assert_eq!(a.3.outbox(), b.3.outbox());
        assert_eq!(a.3.effects(), b.3.effects());
        assert_eq!(a.3.faults(), b.3.faults());
        assert!(a.1 >= Duration::from_millis(20) * 6);
        late += a.3.faults().late_arrivals;
    }
    assert!(late > 10, "late arrivals were part of it: {late}");
}

// ---------------------------------------------------------------- ground truth

#[tokio::test(start_paused = true)]
async fn ground_truth_counts_duplicates() {
    let cfg = SimConfig::new(42, FaultProfile::NONE).with_honour_keys(false);
    let (s, o) = SimServer::new(cfg);
    let c = s.create_customer(C, key(1), None).await.unwrap();
    let c2 = s.create_customer(C, key(1), None).await.unwrap(); // a duplicate customer, latest wins
    assert_eq!((c.version, c2.version), (1, 2));
    for _ in 0..3 {
        s.send_welcome(C, None, None).await.unwrap();
    }
    let c = s.set_customer_status(C, CustomerStatus::Active, 2, None, None).await.unwrap();
    s.update_invoice_row(ROW, INV, AMOUNT, None, None).await.unwrap();
    s.create_record(REC, INV, AMOUNT, None, None).await.unwrap();
    let truth = o.truth();
    assert_eq!(truth.applied(Op::CreateCustomer, C.0).applied, 2);
    assert_eq!(truth.applied(Op::SendWelcome, C.0).applied, 3);
    assert_eq!(truth.applied(Op::SetCustomerStatus, C.0).applied, 1);
    assert_eq!(truth.applied(Op::SendWelcome, 99).applied, 0);
    let mut dups: Vec<_> = truth.duplicates().map(|(e, n)| (e.op, e.target, n.applied)).collect();
    dups.sort();
    assert_eq!(dups, [(Op::CreateCustomer, C.0, 2), (Op::SendWelcome, C.0, 3)]);
    assert!(
        c.activated_at.is_some() && truth.customer(C).unwrap().status == CustomerStatus::Active
    );
    assert!(!ActivateCustomer { customer: C }.holds(&truth), "three welcome messages");
    assert!(
        !RecordInvoice { row: ROW, invoice_id: INV, amount: AMOUNT, record: REC }.holds(&truth)
    );
}

#[tokio::test(start_paused = true)]
async fn a_clean_run_satisfies_both_postconditions() {
    let (s, o) = server(FaultProfile::NONE);
    let c = s.create_customer(C, key(1), None).await.unwrap();
    s.set_customer_status(C, CustomerStatus::Active, c.version, key(2), None).await.unwrap();
    s.send_welcome(C, key(3), None).await.unwrap();
    s.update_invoice_row(ROW, INV, AMOUNT, key(4), None).await.unwrap();
    let r = s.create_record(REC, INV, AMOUNT, key(5), None).await.unwrap();
    s.set_record_status(REC, RecordStatus::Recorded, r.version, key(6), None).await.unwrap();
    let truth = o.truth();
    assert!(ActivateCustomer { customer: C }.holds(&truth));
    assert!(RecordInvoice { row: ROW, invoice_id: INV, amount: AMOUNT, record: REC }.holds(&truth));
    assert!(
        !RecordInvoice { row: ROW, invoice_id: INV, amount: AMOUNT + 1, record: REC }.holds(&truth)
    );
    assert!(!truth.has_duplicates());
    assert_eq!(truth.faults(), Default::default());
}

// ---------------------------------------------------------------- update_record_fields

const TASK: RecordInvoice =
    RecordInvoice { row: ROW, invoice_id: INV, amount: AMOUNT, record: REC };

#[test]
fn the_repair_op_has_its_own_stream_and_left_the_others_unchanged() {
    // Fault streams are keyed by the op's number: the six original ops keep
    // theirs, the new one is numbered after them.
    let numbers = Op::ALL.map(|op| op as u64);
    assert_eq!(numbers, [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(Op::ALL[6], Op::UpdateRecordFields);
    assert!(Op::UpdateRecordFields.is_compound() && Op::UpdateRecordFields.is_versioned());
    assert_eq!(Op::UpdateRecordFields.to_string(), "update_record_fields");
    let p = FaultLevel::Extreme.profile();
    let stream = |op| (0..32).map(|n| p.draw(42, op, n)).collect::<Vec<_>>();
    for op in &Op::ALL[..6] {
        assert_ne!(stream(Op::UpdateRecordFields), stream(*op), "{op}");
    }
}

#[tokio::test(start_paused = true)]
async fn repairs_shift_no_other_operations_faults() {
    let p = FaultLevel::Extreme.profile();
    // One record, then its status set; with and without three repairs in
    // between. The status write faces the same faults either way.
    let run = |repairs: u32| async move {
        let (s, o) = SimServer::new(SimConfig::new(42, p));
        while s.create_record(REC, INV, AMOUNT, None, None).await.is_err() {}
        for _ in 0..repairs {
            let v = o.truth().record(REC).unwrap().version;
            let _ = s.update_record_fields(REC, INV, AMOUNT, v, None, None).await;
        }
        let v = o.truth().record(REC).unwrap().version;
        let status = s.set_record_status(REC, RecordStatus::Recorded, v, None, None).await;
        let truth = o.truth();
        (status.map(|r| r.status), truth.calls(Op::CreateRecord), truth.calls(Op::SetRecordStatus))
    };
    assert_eq!(run(0).await, run(3).await);
}

#[tokio::test(start_paused = true)]
async fn filling_in_a_partial_record_is_not_a_duplicate_but_a_second_full_fill_is() {
    // The creation is partial, and update call 0; the other calls are full
    // (call 1 replays a key, which only draws a timeout).
    let (s, o) = server(FaultProfile::NONE);
    o.script(Op::CreateRecord, 0, partial()).script(Op::UpdateRecordFields, 0, partial());
    let r = s.create_record(REC, INV, AMOUNT, key(1), None).await.unwrap();
    assert_eq!((r.invoice_id, r.amount, r.version), (None, None, 1));

    // A partial repair writes the invoice id, not the amount, and answers OK.
    let r = s.update_record_fields(REC, INV, AMOUNT, 1, key(2), None).await.unwrap();
    assert_eq!((r.invoice_id, r.amount, r.version), (Some(INV), None, 2));
    // Its key replays that answer (call 1, drawn full, applies nothing).
    assert_eq!(s.update_record_fields(REC, INV, AMOUNT, 1, key(2), None).await, Ok(r));
    let truth = o.truth();
    assert_eq!(
        truth.applied(Op::UpdateRecordFields, REC.0),
        EffectCount { applied: 1, partial: 1 }
    );
    assert_eq!(truth.calls(Op::UpdateRecordFields), 2);

    // A new call completes the record: one creation, one full update.
    let r = s.update_record_fields(REC, INV, AMOUNT, 2, key(3), None).await.unwrap();
    assert_eq!((r.invoice_id, r.amount, r.version), (Some(INV), Some(AMOUNT), 3));
    let truth = o.truth();
    assert_eq!(truth.applied(Op::CreateRecord, REC.0), EffectCount { applied: 1, partial: 1 });
    assert_eq!(
        truth.applied(Op::UpdateRecordFields, REC.0),
        EffectCount { applied: 2, partial: 1 }
    );
    assert!(!truth.has_duplicates());
    assert_eq!(truth.faults().partial, 2);
    let r = s.set_record_status(REC, RecordStatus::Recorded, 3, key(4), None).await.unwrap();
    assert_eq!(r.status, RecordStatus::Recorded);
    s.update_invoice_row(ROW, INV, AMOUNT, key(6), None).await.unwrap();
    assert!(TASK.holds(&o.truth()), "the repaired record satisfies record_invoice");

    // The full update applied a second time is a duplicate update.
    s.update_record_fields(REC, INV, AMOUNT, 4, key(5), None).await.unwrap();
    let dups: Vec<_> = o.truth().duplicates().collect();
    assert_eq!(dups.len(), 1);
    assert_eq!(dups[0].0, Effect { op: Op::UpdateRecordFields, target: REC.0 });
    assert_eq!((dups[0].1.applied, dups[0].1.full()), (3, 2));
}

#[tokio::test(start_paused = true)]
async fn update_record_fields_times_out_before_and_after_applying() {
    // The earlier split: lost before the server, or applied then lost.
    let p = FaultProfile::NONE.legacy();
    let (s, o) = server(p);
    o.script(Op::UpdateRecordFields, 0, lost(Timeout::BeforeApplying)).script(
        Op::UpdateRecordFields,
        1,
        lost(Timeout::AfterApplying),
    );
    s.create_record(REC, INV, AMOUNT, None, None).await.unwrap();
    let t0 = Instant::now();
    let new_amount = AMOUNT + 1;
    // Lost before applying: nothing written, no key stored.
    assert_eq!(
        s.update_record_fields(REC, INV, new_amount, 1, key(7), None).await,
        Err(SimError::Timeout)
    );
    assert_eq!(t0.elapsed(), p.timeout_after);
    let truth = o.truth();
    assert_eq!(
        (truth.record(REC).unwrap().amount, truth.record(REC).unwrap().version),
        (Some(AMOUNT), 1)
    );
    assert_eq!(truth.applied(Op::UpdateRecordFields, REC.0).applied, 0);
    // Lost after applying: written, key stored.
    assert_eq!(
        s.update_record_fields(REC, INV, new_amount, 1, key(7), None).await,
        Err(SimError::Timeout)
    );
    let truth = o.truth();
    assert_eq!(
        (truth.record(REC).unwrap().amount, truth.record(REC).unwrap().version),
        (Some(new_amount), 2)
    );
    assert_eq!(truth.applied(Op::UpdateRecordFields, REC.0).applied, 1);
    let f = truth.faults();
    assert_eq!((f.timeouts_before_applying, f.timeouts_after_applying), (1, 1));
    // The same key again, with the now stale version: the stored answer,
    // not a conflict and not a second write.
    let r = s.update_record_fields(REC, INV, new_amount, 1, key(7), None).await.unwrap();
    assert_eq!((r.amount, r.version), (Some(new_amount), 2));
    assert_eq!(o.truth().applied(Op::UpdateRecordFields, REC.0).applied, 1);
    // Another record's update under that key is refused.
    let err = s.update_record_fields(RecordId(6), INV, new_amount, 1, key(7), None).await;
    assert_eq!(err, Err(SimError::KeyReuse));
}

#[tokio::test(start_paused = true)]
async fn update_record_fields_without_server_keys_applies_every_call() {
    let cfg = SimConfig::new(42, FaultProfile::NONE).with_honour_keys(false);
    let (s, o) = SimServer::new(cfg);
    s.create_record(REC, INV, AMOUNT, None, None).await.unwrap();
    s.update_record_fields(REC, INV, AMOUNT, 1, key(1), None).await.unwrap();
    // The same key is no protection, but the stale version is.
    let err = s.update_record_fields(REC, INV, AMOUNT, 1, key(1), None).await;
    assert_eq!(err, Err(SimError::Conflict { expected: 1, actual: 2 }));
    s.update_record_fields(REC, INV, AMOUNT, 2, key(1), None).await.unwrap();
    let truth = o.truth();
    assert_eq!(truth.applied(Op::UpdateRecordFields, REC.0).full(), 2);
    assert!(truth.has_duplicates());
}

#[tokio::test(start_paused = true)]
async fn update_record_fields_hits_conflicts_and_missing_records() {
    // Call 0 draws a conflict, but there is no record to bump nor to update.
    let (s, o) = server(FaultProfile::NONE);
    o.script(Op::UpdateRecordFields, 0, conflict());
    let err = s.update_record_fields(REC, INV, AMOUNT, 1, key(1), None).await;
    assert_eq!(err, Err(SimError::NotFound));
    assert_eq!(o.truth().faults().conflicts, 0);
    // The same draw with the record: the concurrent writer bumps it first.
    let (s, o) = server(FaultProfile::NONE);
    o.script(Op::UpdateRecordFields, 0, conflict());
    s.create_record(REC, INV, AMOUNT, None, None).await.unwrap();
    let err = s.update_record_fields(REC, INV, AMOUNT + 1, 1, key(1), None).await.unwrap_err();
    assert_eq!(err, SimError::Conflict { expected: 1, actual: 2 });
    let truth = o.truth();
    let r = truth.record(REC).unwrap();
    assert_eq!((r.amount, r.version), (Some(AMOUNT), 2));
    assert_eq!(truth.faults().conflicts, 1);
    assert_eq!(truth.applied(Op::UpdateRecordFields, REC.0).applied, 0);
    // The rejected call stored no key: re-read, retry under the same key.
    let fresh = s.get_record(REC).await.unwrap().unwrap();
    let r =
        s.update_record_fields(REC, INV, AMOUNT + 1, fresh.version, key(1), None).await.unwrap();
    assert_eq!((r.amount, r.version, r.status), (Some(AMOUNT + 1), 3, RecordStatus::Draft));
}

#[tokio::test(start_paused = true)]
async fn a_delayed_repair_shows_the_partial_record_until_the_lag_ends() {
    // The creation is partial; the repair is full, and lags.
    let repair = lagged(2, 300);
    let lag = repair.lag.unwrap();
    let (s, o) = server(FaultProfile::NONE);
    o.script(Op::CreateRecord, 0, partial()).script(Op::UpdateRecordFields, 0, repair);
    s.create_record(REC, INV, AMOUNT, None, None).await.unwrap();
    let t0 = Instant::now();
    let r = s.update_record_fields(REC, INV, AMOUNT, 1, None, None).await.unwrap();
    assert_eq!((r.amount, r.version), (Some(AMOUNT), 2));
    assert_eq!(o.truth().record(REC).unwrap().amount, Some(AMOUNT), "the primary has it");
    for _ in 0..lag.reads {
        let seen = s.get_record(REC).await.unwrap().unwrap();
        assert_eq!((seen.amount, seen.version), (None, 1), "stale: the partial record");
    }
    tokio::time::sleep_until(t0 + lag.time).await;
    let seen = s.get_record(REC).await.unwrap().unwrap();
    assert_eq!((seen.invoice_id, seen.amount, seen.version), (Some(INV), Some(AMOUNT), 2));
    assert_eq!(o.truth().faults().delayed, 1);
}

// ---------------------------------------------------------------- with the engine

#[tokio::test(start_paused = true)]
async fn the_engine_recovers_an_applied_timeout_through_the_simulator() {
    use verified_tools::ledger::Codec;
    use verified_tools::{Context, Proof, SideEffect, ToolResult, ToolSpec, Verdict, engine};
    static SEND: ToolSpec = ToolSpec::new("send_welcome", SideEffect::High).with_verifier();

    let p = FaultLevel::High.profile();
    for honour in [true, false] {
        let (s, o, _) = with_customer(SimConfig::new(42, p).with_honour_keys(honour)).await;
        // Applied, its answer lost, and out of sight for two reads: the
        // verifier reads stale data before it sees the message.
        let hidden = FaultDraw { lag: lagged(2, 6).lag, ..lost(Timeout::AfterApplying) };
        o.script(Op::SendWelcome, 0, hidden);
        let cx = Context::new("agent").for_step("episode", 3);
        let stale = std::sync::atomic::AtomicU32::new(0);
        let result: ToolResult<(), SimError> = engine::call(
            &cx,
            &SEND,
            &(C.0,),
            &(C.0,),
            |attempt: engine::Attempt| {
                let s = Arc::clone(&s);
                let (key, deadline) = (attempt.key, attempt.deadline);
                async move { s.send_welcome(C, Some(key), Some(deadline)).await.map(|_| ()) }
            },
            Some(|_key| {
                let (s, stale) = (Arc::clone(&s), &stale);
                async move {
                    match s.count_messages(C).await {
                        Ok(0) => {
                            stale.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            Verdict::Absent
                        }
                        Ok(_) => Verdict::Holds(()),
                        Err(_) => Verdict::Unknown,
                    }
                }
            }),
            Codec::serde(),
        )
        .await;
        let proved = matches!(result, ToolResult::Success { proof: Proof::Verifier, .. });
        assert!(proved, "{honour}: {result:?}");
        // Two stale reads said absent before the settle point, and were
        // not trusted: no second send, so one message even without keys.
        assert_eq!(stale.into_inner(), 2, "{honour}");
        let truth = o.truth();
        assert_eq!(truth.calls(Op::SendWelcome), 1, "{honour}");
        assert_eq!(truth.welcome_messages(C), 1, "{honour}");
    }
}

#[test]
fn server_futures_are_send() {
    fn is_send<T: Send>(_: &T) {}
    let (s, _o) = SimServer::new(SimConfig::new(1, FaultProfile::NONE));
    is_send(&s.send_welcome(C, None, None));
    is_send(&s.messages(C));
    is_send(&s.set_record_status(REC, RecordStatus::Recorded, 1, None, None));
    is_send(&s.update_record_fields(REC, INV, AMOUNT, 1, None, None));
}

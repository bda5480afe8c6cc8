//! The draws against their configured rates, and against the draws of
//! earlier simulators the seeds must still reproduce. Apart because they
//! are as long as the model they check.

use super::*;

const DRAWS: u32 = 10_000;

/// Shares of each outcome over `DRAWS` draws of every operation (70,000
/// draws): timeout, applied at once, late, lost before, lag, partial,
/// conflict, partial OK.
fn frequencies(p: &FaultProfile, seed: u64) -> [f64; 8] {
    let mut c = [0u32; 8];
    for op in Op::ALL {
        for n in 0..DRAWS {
            let d = p.draw(seed, op, n);
            c[0] += u32::from(d.timeout.is_some());
            c[1] += u32::from(d.timeout == Some(Timeout::AfterApplying));
            c[2] += u32::from(matches!(d.timeout, Some(Timeout::Late(_))));
            c[3] += u32::from(d.timeout == Some(Timeout::BeforeApplying));
            c[4] += u32::from(d.lag.is_some());
            c[5] += u32::from(d.partial);
            c[6] += u32::from(d.conflict);
            c[7] += u32::from(d.partial_ok);
        }
    }
    let total = f64::from(DRAWS) * Op::ALL.len() as f64;
    c.map(|x| f64::from(x) / total)
}

#[test]
fn table_1_probabilities() {
    let t = |l: FaultLevel| {
        let p = l.profile();
        (p.timeout, p.delayed_visibility, p.partial_success, p.conflict)
    };
    assert_eq!(t(FaultLevel::Low), (0.05, 0.05, 0.03, 0.02));
    assert_eq!(t(FaultLevel::Medium), (0.20, 0.15, 0.10, 0.05));
    assert_eq!(t(FaultLevel::High), (0.35, 0.25, 0.15, 0.10));
    assert_eq!(t(FaultLevel::Extreme), (0.50, 0.40, 0.25, 0.20));
}

#[test]
fn each_mode_occurs_at_its_configured_rate() {
    let profiles = FaultLevel::ALL.map(|l| (l, l.profile(), 0.0));
    let partial_ok = FaultLevel::ALL.map(|l| (l, l.partial_ok_profile(), l.partial_ok_rate()));
    for (level, p, want_partial_ok) in profiles.into_iter().chain(partial_ok) {
        let f = frequencies(&p, 42);
        // 70,000 draws: a standard error of at most 0.0019; allow ~5 of them.
        let close = |got: f64, want: f64| (got - want).abs() < 0.01;
        assert!(close(f[0], p.timeout), "{level} timeout {}", f[0]);
        // After dispatch: every timed-out request reached the server,
        // half of them late.
        assert_eq!(f[3], 0.0, "{level}: none lost before the server");
        assert!(close(f[1], p.timeout * 0.5), "{level} applied at once {}", f[1]);
        assert!(close(f[2], p.timeout * 0.5), "{level} late arrivals {}", f[2]);
        assert!(close(f[4], p.delayed_visibility), "{level} delayed {}", f[4]);
        assert!(close(f[5], p.partial_success), "{level} partial {}", f[5]);
        assert!(close(f[6], p.conflict), "{level} conflict {}", f[6]);
        assert!(close(f[7], want_partial_ok), "{level} partial OK {}", f[7]);
        assert_eq!(want_partial_ok == 0.0, f[7] == 0.0, "{level}");
    }
}

#[test]
fn partial_ok_rates_are_table_1_s_partial_rates() {
    let rates = FaultLevel::ALL.map(FaultLevel::partial_ok_rate);
    assert_eq!(rates, [0.03, 0.10, 0.15, 0.25]);
    for level in FaultLevel::ALL {
        let p = level.partial_ok_profile();
        assert_eq!(p, level.profile().with_partial_ok(level.partial_ok_rate()));
        assert_eq!(level.profile().partial_ok, 0.0);
    }
    assert_eq!(FaultProfile::NONE.partial_ok, 0.0);
}

#[test]
fn the_partial_ok_draw_left_every_earlier_fault_where_it_was() {
    let (mut both, mut partial, mut partial_ok, mut n_all) = (0u32, 0u32, 0u32, 0u32);
    for level in FaultLevel::ALL {
        for (old, new) in [
            (level.profile(), level.partial_ok_profile()),
            (level.profile().legacy(), level.partial_ok_profile().legacy()),
        ] {
            for op in Op::ALL {
                for n in 0..2_000 {
                    let (a, b) = (old.draw(42, op, n), new.draw(42, op, n));
                    assert!(!a.partial_ok, "{level} {op} {n}");
                    assert_eq!(FaultDraw { partial_ok: false, ..b }, a, "{level} {op} {n}");
                    if level == FaultLevel::Extreme {
                        n_all += 1;
                        partial += u32::from(b.partial);
                        partial_ok += u32::from(b.partial_ok);
                        both += u32::from(b.partial && b.partial_ok);
                    }
                }
            }
        }
    }
    // Drawn independently of the partial success: both together at the
    // product of their rates (0.25², 1,750 of 28,000 expected).
    let share = |k: u32| f64::from(k) / f64::from(n_all);
    assert!((share(partial) - 0.25).abs() < 0.015, "{}", share(partial));
    assert!((share(partial_ok) - 0.25).abs() < 0.015, "{}", share(partial_ok));
    assert!((share(both) - 0.0625).abs() < 0.01, "{}", share(both));
}

#[test]
fn the_before_or_after_split_occurs_as_configured() {
    let p = FaultLevel::Medium.profile().with_timeout_applied_share(0.25);
    let (mut before, mut reached, mut late) = (0u32, 0u32, 0u32);
    for n in 0..DRAWS {
        match p.draw(7, Op::SendWelcome, n).timeout {
            Some(Timeout::BeforeApplying) => before += 1,
            Some(Timeout::AfterApplying) => reached += 1,
            Some(Timeout::Late(_)) => {
                reached += 1;
                late += 1;
            }
            None => {}
        }
    }
    let share = f64::from(reached) / f64::from(before + reached);
    assert!(before > 0 && reached > 0);
    assert!((share - 0.25).abs() < 0.04, "{share}");
    // Late arrivals are a share of the requests that reached the server.
    let late_share = f64::from(late) / f64::from(reached);
    assert!((late_share - 0.5).abs() < 0.08, "{late_share}");
}

/// The draw as it was before late arrivals and the lag tail were
/// appended, written out again: the seven draws it made, in its order.
fn draw_before_issue_9(p: &FaultProfile, applied_share: f64, s: u64, op: Op, n: u32) -> FaultDraw {
    let mut rng = Rng::stream(s, &[op as u64, u64::from(n)]);
    let timeout = rng.chance(p.timeout);
    let applied = rng.chance(applied_share);
    let delayed = rng.chance(p.delayed_visibility);
    let reads = rng.one_to(u64::from(p.lag_reads)) as u32;
    let ms = rng.one_to(p.lag_time.as_millis() as u64);
    let partial = rng.chance(p.partial_success);
    let conflict = rng.chance(p.conflict);
    FaultDraw {
        timeout: timeout.then_some(if applied {
            Timeout::AfterApplying
        } else {
            Timeout::BeforeApplying
        }),
        lag: delayed.then_some(Lag {
            reads,
            time: Duration::from_millis(ms),
            bound: p.lag_bound(),
        }),
        partial,
        conflict,
        partial_ok: false,
    }
}

#[test]
fn the_appended_draws_left_every_earlier_fault_where_it_was() {
    for level in FaultLevel::ALL {
        let paper = level.profile();
        let legacy = paper.legacy();
        for op in Op::ALL {
            for n in 0..2_000 {
                let old = draw_before_issue_9(&paper, 0.5, 42, op, n);
                // The legacy profile faces every call exactly as before.
                assert_eq!(legacy.draw(42, op, n), old, "{level} {op} {n}");
                // The default one on the same calls: the same timeouts
                // (now all after dispatch), lags, partials, conflicts.
                let new = paper.draw(42, op, n);
                assert_eq!(new.timeout.is_some(), old.timeout.is_some());
                assert_ne!(new.timeout, Some(Timeout::BeforeApplying));
                assert_eq!((new.partial, new.conflict), (old.partial, old.conflict));
                assert_eq!(new.lag.map(|l| l.reads), old.lag.map(|l| l.reads));
            }
        }
    }
}

#[test]
fn late_arrivals_have_their_heavy_tailed_delay() {
    let p = FaultProfile { timeout: 1.0, ..FaultProfile::NONE };
    let delays: Vec<Duration> = (0..DRAWS)
        .filter_map(|n| match p.draw(3, Op::SendWelcome, n).timeout {
            Some(Timeout::Late(d)) => Some(d),
            _ => None,
        })
        .collect();
    let share = delays.len() as f64 / f64::from(DRAWS);
    assert!((share - 0.5).abs() < 0.02, "{share}");
    let over = |ms| delays.iter().filter(|d| **d > Duration::from_millis(ms)).count() as f64;
    let n = delays.len() as f64;
    assert!(delays.iter().all(|d| *d >= Duration::from_millis(100)));
    // P(> 1 s) = 0.1, P(> 10 s) = 0.01: the tail reaches 100 × the minimum.
    assert!((over(1_000) / n - 0.1).abs() < 0.015, "{}", over(1_000) / n);
    assert!((over(10_000) / n - 0.01).abs() < 0.005, "{}", over(10_000) / n);
    assert!(delays.iter().any(|d| *d > Duration::from_secs(60)), "unbounded by default");
}

#[test]
fn lags_have_a_bulk_and_a_bounded_heavy_tail() {
    let p = FaultProfile { delayed_visibility: 1.0, ..FaultProfile::NONE };
    let lags: Vec<Lag> = (0..DRAWS).map(|n| p.draw(5, Op::CreateRecord, n).lag.unwrap()).collect();
    let bulk = Duration::from_secs(1);
    let n = lags.len() as f64;
    let beyond = |d: Duration| lags.iter().filter(|l| l.time > d).count() as f64 / n;
    // One lag in ten comes from the tail (Pareto from 1 s): none of the
    // bulk exceeds 1 s, 0.1 · 2^-1.5 = 3.5% exceed 2 s, 0.1 · 4^-1.5 =
    // 1.25% exceed 4 s, and 0.1 · 5^-1.5 = 0.9% sit at the 5 s bound.
    assert!((beyond(bulk) - 0.1).abs() < 0.015, "{}", beyond(bulk));
    assert!((beyond(2 * bulk) - 0.035).abs() < 0.01, "{}", beyond(2 * bulk));
    assert!((beyond(4 * bulk) - 0.0125).abs() < 0.006, "{}", beyond(4 * bulk));
    let at_bound = lags.iter().filter(|l| l.time == 5 * bulk).count() as f64 / n;
    assert!(at_bound > 0.004 && at_bound < 0.015, "{at_bound}");
    assert!(lags.iter().all(|l| l.time <= 5 * bulk && l.bound == Some(5 * bulk)));
    // Unbounded when the tail has no cap.
    let open = p.with_lag_tail(0.5, Pareto::new(bulk, 1.5, None));
    assert_eq!(open.lag_bound(), None);
    let far = (0..DRAWS).filter_map(|n| open.draw(5, Op::CreateRecord, n).lag);
    assert!(far.filter(|l| l.time > 30 * bulk).count() > 10);
}

#[test]
fn lags_cover_their_ranges() {
    let p = FaultProfile { delayed_visibility: 1.0, ..FaultProfile::NONE }
        .with_lag(3, Duration::from_millis(10))
        .with_lag_tail(0.0, FaultProfile::NONE.lag_tail_time);
    // The tail's cap bounds the replica even when no lag is drawn from it.
    assert_eq!(p.lag_bound(), Some(Duration::from_secs(5)));
    let mut reads = [0u32; 4];
    let mut ms = [0u32; 11];
    for n in 0..DRAWS {
        let lag = p.draw(1, Op::CreateRecord, n).lag.unwrap();
        reads[lag.reads as usize] += 1;
        ms[lag.time.as_millis() as usize] += 1;
    }
    assert_eq!(reads[0], 0);
    assert!(reads[1..].iter().all(|&c| c > 3_000), "{reads:?}");
    assert_eq!(ms[0], 0);
    assert!(ms[1..].iter().all(|&c| c > 800), "{ms:?}");
}

#[test]
fn pareto_draws_follow_their_survival_function() {
    let p = Pareto::new(Duration::from_millis(100), 1.0, Some(Duration::from_secs(60)));
    let mut rng = Rng::new(9);
    let draws: Vec<Duration> = (0..100_000).map(|_| p.at(rng.next_f64())).collect();
    for ms in [200u64, 1_000, 5_000] {
        let d = Duration::from_millis(ms);
        let got = draws.iter().filter(|x| **x > d).count() as f64 / draws.len() as f64;
        assert!((got - p.exceeds(d)).abs() < 0.005, "{ms}: {got}");
    }
    assert!(draws.iter().all(|d| *d >= p.scale && *d <= p.max()));
    assert_eq!(p.at(1.0), Duration::from_secs(60));
    assert_eq!(Pareto { alpha: f64::NAN, ..p }.at(0.5), Duration::from_millis(200));
    assert_eq!(Pareto::new(Duration::from_secs(1), 2.0, None).max(), UNCAPPED);
}

#[test]
fn no_faults_without_probability() {
    for op in Op::ALL {
        for n in 0..1_000 {
            assert_eq!(FaultProfile::NONE.draw(42, op, n), FaultDraw::default());
        }
    }
}

#[test]
fn draws_depend_on_seed_op_and_call_only() {
    let p = FaultLevel::Extreme.profile();
    let stream = |seed, op| (0..64).map(|n| p.draw(seed, op, n)).collect::<Vec<_>>();
    assert_eq!(stream(42, Op::SendWelcome), stream(42, Op::SendWelcome));
    assert_ne!(stream(42, Op::SendWelcome), stream(43, Op::SendWelcome));
    assert_ne!(stream(42, Op::SendWelcome), stream(42, Op::CreateRecord));
}

#[test]
fn levels_parse_and_print() {
    for level in FaultLevel::ALL {
        assert_eq!(level.to_string().parse::<FaultLevel>(), Ok(level));
    }
    assert_eq!(" HIGH ".parse::<FaultLevel>(), Ok(FaultLevel::High));
    assert!("".parse::<FaultLevel>().is_err());
}

use super::*;

fn window(rate: f64, faults: Vec<Fault>) -> Window {
    Window {
        name: "w".into(),
        start_ms: 0,
        duration_ms: None,
        error_rate: rate,
        faults,
        latency: None,
        phone_number_ids: vec![],
    }
}

fn err(code: i64, weight: u32) -> Fault {
    Fault { kind: FaultKind::Error { code, http_status: None, subcode: None }, weight }
}

#[test]
fn deterministic_selection_gives_exact_counts_and_mix() {
    let s = Scenario {
        selection: Selection::Deterministic,
        windows: vec![window(0.25, vec![err(130429, 1), err(131000, 3)])],
        ..Scenario::default()
    };
    let active = Active::start(s);
    let mut codes = Vec::new();
    for _ in 0..400 {
        if let Some(FaultKind::Error { code, .. }) = active.decide("1").fault {
            codes.push(code);
        }
    }
    assert_eq!(codes.len(), 100);
    assert_eq!(codes.iter().filter(|c| **c == 130429).count(), 25);
    assert_eq!(codes.iter().filter(|c| **c == 131000).count(), 75);
}

#[test]
fn random_selection_is_seeded_and_near_the_rate() {
    let s = Scenario { seed: Some(9), windows: vec![window(0.28, vec![err(2, 1)])], ..Scenario::default() };
    let run = || {
        let active = Active::start(s.clone());
        (0..5000).map(|_| active.decide("1").fault.is_some()).collect::<Vec<_>>()
    };
    let a = run();
    assert_eq!(a, run(), "same seed, same draws");
    let hits = a.iter().filter(|x| **x).count();
    assert!((1200..1600).contains(&hits), "{hits} of 5000 at 28%");
}

#[test]
fn windows_respect_time_and_phone_filter() {
    let mut w = window(1.0, vec![err(2, 1)]);
    w.start_ms = 60_000;
    let mut f = window(1.0, vec![err(131000, 1)]);
    f.phone_number_ids = vec!["only".into()];
    let active = Active::start(Scenario { windows: vec![w, f], ..Scenario::default() });
    assert!(active.decide("other").fault.is_none(), "first window not started, second filtered");
    assert!(matches!(active.decide("only").fault, Some(FaultKind::Error { code: 131000, .. })));
}

#[test]
fn toml_round_trip_and_validation() {
    let text = include_str!("../../scenarios/flash-sale-outage.toml");
    let s = Scenario::from_toml(text).expect("shipped example parses");
    assert_eq!(s.name, "flash-sale-outage");
    assert_eq!(s.windows[0].error_rate, 0.28);
    assert_eq!(s, Scenario::builtin("flash-sale-outage").expect("built in"), "example == built-in");
    let back = Scenario::from_toml(&toml::to_string(&s).expect("serializes")).expect("reparses");
    assert_eq!(back, s);
    let json = serde_json::to_vec(&s).expect("json");
    assert_eq!(Scenario::from_json(&json).expect("json parses"), s);

    assert!(Scenario::from_toml("[[windows]]\nstart_ms = 0\nerror_rate = 1.5\n").is_err());
    assert!(Scenario::from_toml("[[windows]]\nstart_ms = 0\nerror_rate = 0.5\n").is_err(), "rate without faults");
    assert!(Scenario::from_toml("bogus = 1\n").is_err());
    assert!(Scenario::builtin("nope").is_err());
}

#[test]
fn latency_samples_stay_in_range() {
    let rng = Rng::new(3);
    for _ in 0..1000 {
        let u = Latency::Uniform { min_ms: 10, max_ms: 20 }.sample(&rng);
        assert!(u >= Duration::from_millis(10) && u <= Duration::from_millis(20));
        let n = Latency::Normal { mean_ms: 5.0, stddev_ms: 50.0 }.sample(&rng);
        assert!(n <= Duration::from_millis(305));
    }
    assert_eq!(Latency::Fixed { ms: 7 }.sample(&rng), Duration::from_millis(7));
}

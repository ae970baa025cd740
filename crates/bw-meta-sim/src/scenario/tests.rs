use super::*;

fn window(rate: f64, faults: Vec<Fault>) -> Window {
    Window { error_rate: rate, faults, ..Window::new("w", 0, None) }
}

fn err(code: i64, weight: u32) -> Fault {
    Fault { kind: FaultKind::error(code), weight }
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

#[test]
fn unknown_keys_are_refused_with_their_name() {
    let cases = [
        ("bogus = 1\n", "bogus"),
        ("[[windows]]\nstart_ms = 0\nerorr_rate = 0.5\n", "erorr_rate"),
        (
            "[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"error\", code = 2, wieght = 1 }]\n",
            "wieght",
        ),
        (
            "[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"reset\", after_procesing = true }]\n",
            "after_procesing",
        ),
        ("[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"explode\" }]\n", "explode"),
        ("[limits]\napp_call = 5\n", "app_call"),
        ("[[token_events]]\ntoken = \"t\"\nat = 5\n", "at"),
        ("[[windows]]\nstart_ms = 0\nlatency = { kind = \"fixed\", ms = 1, jitter = 2 }\n", "jitter"),
    ];
    for (text, key) in cases {
        let err = Scenario::from_toml(text).expect_err(text).to_string();
        assert!(err.contains(&format!("`{key}`")), "error names `{key}`: {err}");
    }
    let weight = Scenario::from_toml(
        "[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"error\", code = 2, weight = -1 }]\n",
    );
    assert!(weight.expect_err("negative weight").to_string().contains("weight"));
}

#[test]
fn invalid_values_are_refused_precisely() {
    let cases = [
        ("[[status_windows]]\nname = \"late\"\nstart_ms = 0\ndrop_rate = 2.0\n", "status window `late`: drop_rate"),
        ("[[status_windows]]\nstart_ms = 0\n", "status window `#1`: set delay_ms or drop_rate"),
        (
            "[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"bodiless\", status = 200 }]\n",
            "bodiless fault status must be 4xx or 5xx",
        ),
        ("[[windows]]\nstart_ms = 0\nduration_ms = 0\n", "window `#1`: duration_ms"),
        ("[[token_events]]\ntoken = \"t\"\ncode = 200\n", "token_events[0]: code"),
        ("[limits]\nwaba_code = 4\n", "waba_code"),
        ("[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"hang\", hold_ms = 0 }]\n", "hold_ms"),
        (
            "[[windows]]\nstart_ms = 0\nerror_rate = 1.0\nfaults = [{ kind = \"http\", status = 503, page = \"plain\" }]\n",
            "unknown field `page`",
        ),
    ];
    for (text, want) in cases {
        let err = Scenario::from_toml(text).expect_err(text).to_string();
        assert!(err.contains(want), "`{want}` in: {err}");
    }
}

#[test]
fn mixed_ambiguous_example_parses_and_round_trips() {
    let text = include_str!("../../scenarios/mixed-ambiguous.toml");
    let s = Scenario::from_toml(text).expect("shipped example parses");
    assert_eq!(s.name, "mixed-ambiguous");
    let kinds: Vec<&FaultKind> = s.windows.iter().flat_map(|w| w.faults.iter().map(|f| &f.kind)).collect();
    assert!(kinds.iter().any(|k| matches!(k, FaultKind::Bodiless { after_processing: true, .. })));
    assert!(kinds.iter().any(|k| matches!(k, FaultKind::Reset { after_processing: true })));
    assert!(kinds.iter().any(|k| matches!(k, FaultKind::Hang { accept: true, .. })));
    assert!(kinds.iter().any(|k| matches!(k, FaultKind::OkUnparseable { .. })));
    assert!(kinds.iter().any(|k| matches!(k, FaultKind::Error { code: 4, .. })));
    assert!(s.status_windows.iter().any(|w| w.delay_ms.is_some()));
    assert_eq!(Scenario::builtin("mixed-ambiguous").expect("built in"), s);
    let back = Scenario::from_toml(&toml::to_string(&s).expect("serializes")).expect("reparses");
    assert_eq!(back, s);
    assert_eq!(Scenario::from_json(&serde_json::to_vec(&s).expect("json")).expect("json parses"), s);
}

#[test]
fn status_effects_and_token_events_follow_the_clock() {
    let w = StatusWindow {
        delay_ms: Some(5_000),
        drop_rate: 0.5,
        phone_number_ids: vec!["1".into()],
        ..StatusWindow::default()
    };
    let s = Scenario {
        selection: Selection::Deterministic,
        status_windows: vec![w],
        token_events: vec![
            TokenEvent { token: "now".into(), at_ms: 0, code: 0 },
            TokenEvent { token: "later".into(), at_ms: 3_600_000, code: 190 },
        ],
        ..Scenario::default()
    };
    let active = Active::start(s);
    let decisions: Vec<Decision> = (0..10).map(|_| active.decide("1")).collect();
    assert!(decisions.iter().all(|d| d.status_delay == Duration::from_secs(5) && d.fault.is_none()));
    assert_eq!(decisions.iter().filter(|d| d.drop_statuses).count(), 5, "deterministic 50% dropped");
    assert!(!active.decide("2").drop_statuses, "filtered number unaffected");
    assert_eq!(active.token_fault("now"), Some(0));
    assert_eq!(active.token_fault("later"), None, "event not reached yet");
    assert_eq!(active.token_fault("other"), None);
}

#[test]
fn error_codes_and_account_signals_examples_parse_and_round_trip() {
    for (name, text) in [
        ("error-codes", include_str!("../../scenarios/error-codes.toml")),
        ("account-signals", include_str!("../../scenarios/account-signals.toml")),
        ("flash-sale-past-the-limit", include_str!("../../scenarios/flash-sale-past-the-limit.toml")),
    ] {
        let s = Scenario::from_toml(text).expect("shipped example parses");
        assert_eq!(s.name, name);
        assert_eq!(Scenario::builtin(name).expect("built in"), s);
        let back = Scenario::from_toml(&toml::to_string(&s).expect("serializes")).expect("reparses");
        assert_eq!(back, s, "{name} round-trips through toml");
        assert_eq!(Scenario::from_json(&serde_json::to_vec(&s).expect("json")).expect("json parses"), s);
    }
    let codes = Scenario::builtin("error-codes").expect("built in");
    assert!(codes.injections.iter().any(|i| !i.waba_ids.is_empty() && i.code == 368));
    assert!(codes.injections.iter().any(|i| i.is_async() && i.code == 131026), "A-only codes default to async");
    let signals = Scenario::builtin("account-signals").expect("built in");
    let kinds: Vec<&str> = signals.events.iter().map(|e| e.kind.kind_name()).collect();
    for kind in [
        "account_update",
        "business_capability_update",
        "phone_number_quality_update",
        "account_alerts",
        "message_template_status_update",
        "message_template_quality_update",
        "template_category_update",
        "user_preferences",
        "smb_message_echoes",
        "value_errors",
        "inbound",
        "template_pacing",
        "system",
        "raw",
    ] {
        assert!(kinds.contains(&kind), "the example shows {kind}");
    }
}

#[test]
fn injection_picks_respect_targets_rate_and_max() {
    let mut only = Injection::new(368);
    only.phone_number_ids = vec!["a".into()];
    only.max = Some(2);
    let s = Scenario { selection: Selection::Deterministic, injections: vec![only], ..Scenario::default() };
    let active = Active::start(s);
    let call = |phone| Call { phone_number_id: phone, message_type: "text", ..Call::default() };
    assert!(active.pick_injection(&call("b")).is_none(), "another number");
    let picks = (0..5).filter(|_| active.pick_injection(&call("a")).is_some()).count();
    assert_eq!(picks, 2, "max");
}

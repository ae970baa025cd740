//! Throughput (130429) and pair (131056) limits.

use crate::common::*;
use bw_meta_sim::{Limits, SimConfig};
use std::time::{Duration, Instant};

#[tokio::test]
async fn throughput_limit_trips_at_the_configured_rate() {
    let limits = Limits { throughput_mps: 10.0, throughput_burst: 5, pair_enabled: false, ..Limits::default() };
    let sim = start(SimConfig { limits, ..config() }).await;
    let client = client(Duration::from_secs(5));

    let started = Instant::now();
    let sends = (0..60).map(|i| {
        let (client, sim) = (&client, &sim);
        async move { send(client, sim, &recipient(i), Some(&format!("op-{i}"))).await.expect("answered") }
    });
    let answers = futures::future::join_all(sends).await;
    let elapsed = started.elapsed().as_secs_f64();

    let ok = answers.iter().filter(|a| a.status == 200).count() as f64;
    let throttled: Vec<_> = answers.iter().filter(|a| a.code() == 130429).collect();
    assert_eq!(ok as usize + throttled.len(), 60, "every answer is a 200 or a 130429");
    // The burst plus what the rate allows while the burst was being sent.
    assert!(ok >= 5.0 && ok <= 5.0 + 10.0 * elapsed + 1.0, "{ok} accepted in {elapsed:.3}s at 10 mps, burst 5");
    assert!(!throttled.is_empty());

    let t = throttled[0];
    assert_eq!(t.status, 400, "throttles come back as HTTP 400 by default");
    assert_eq!(t.body["error"]["message"], "(#130429) Rate limit hit");
    assert_eq!(t.body["error"]["type"], "OAuthException");
    assert_eq!(t.body["error"]["error_data"]["messaging_product"], "whatsapp");
    assert_eq!(t.body["error"]["error_data"]["details"], "Cloud API message throughput has been reached.");
    assert!(t.body["error"]["fbtrace_id"].as_str().is_some_and(|f| !f.is_empty()));
    let usage: serde_json::Value = serde_json::from_str(
        t.headers.get("x-business-use-case-usage").expect("usage header").to_str().expect("ascii"),
    )
    .expect("usage is json");
    let row = &usage["102290129340398"][0];
    assert_eq!(row["type"], "whatsapp");
    assert_eq!(row["call_count"], 100);
    assert!(row["estimated_time_to_regain_access"].as_u64().is_some_and(|m| m >= 1));
    assert!(t.headers.get("x-app-usage").is_some());

    let counters = sim.counters();
    assert_eq!(counters.outcome("130429"), throttled.len() as u64);
    assert_eq!(counters.outcome("200"), ok as u64);
    assert_eq!(sim.total_accepted(), ok as u64, "throttled messages were not created");

    // Back within the limit after the bucket drains.
    wait_until(Duration::from_secs(3), || async {
        send(&client, &sim, &recipient(999), None).await.expect("answered").status == 200
    })
    .await;
}

#[tokio::test]
async fn higher_throughput_per_number_override() {
    let mut cfg = config();
    cfg.limits = Limits { throughput_mps: 1.0, throughput_burst: 1, pair_enabled: false, ..Limits::default() };
    cfg.phone_numbers
        .insert(PHONE.into(), bw_meta_sim::PhoneNumberConfig { throughput_mps: Some(1_000.0), ..Default::default() });
    let sim = start(cfg).await;
    let client = client(Duration::from_secs(5));
    // At 1 mps with burst 1 the second send would fail; at the number's 1,000 mps override, sends 2 ms apart
    // (twice the override's interval) all pass.
    let mut ok = 0;
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(2)).await;
        if send(&client, &sim, &recipient(i), None).await.expect("answered").status == 200 {
            ok += 1;
        }
    }
    assert_eq!(ok, 3, "override applies");
}

#[tokio::test]
async fn pair_limit_trips_after_the_burst() {
    let limits = Limits {
        throughput_mps: 10_000.0,
        throughput_burst: 100,
        pair_interval_ms: 60_000,
        pair_burst: 3,
        ..Limits::default()
    };
    let sim = start(SimConfig { limits, retry_after: true, ..config() }).await;
    let client = client(Duration::from_secs(5));
    let to = recipient(1);
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(send(&client, &sim, &to, None).await.expect("answered"));
    }
    assert_eq!(codes.iter().map(Answer::code).collect::<Vec<_>>(), vec![0, 0, 0, 131056, 131056]);
    let refused = &codes[3];
    assert_eq!(refused.body["error"]["message"], "(#131056) (Business Account, Consumer Account) pair rate limit hit");
    let retry_after: u64 = refused.headers["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    // GCRA: TAT = now + 3 × 60 s after the burst, tolerance 2 × 60 s, so the next send is allowed in 60 s.
    assert!((55..=60).contains(&retry_after), "one interval after a burst of 3 at 1/60 s: {retry_after}s");

    assert_eq!(send(&client, &sim, &recipient(2), None).await.expect("answered").status, 200, "other user is fine");
    assert_eq!(sim.counters().outcome("131056"), 2);

    // Limits switched off at runtime: the same pair goes through.
    sim.set_limits(Limits::disabled());
    assert_eq!(send(&client, &sim, &to, None).await.expect("answered").status, 200);
}

#[tokio::test]
async fn meta_default_pair_limit_allows_a_burst_of_45() {
    let limits = Limits { throughput_mps: 10_000.0, throughput_burst: 100, ..Limits::default() };
    assert_eq!((limits.pair_interval_ms, limits.pair_burst), (6_000, 45));
    let sim = start(SimConfig { limits, ..config() }).await;
    let client = client(Duration::from_secs(5));
    let mut ok = 0;
    let mut refused = 0;
    for _ in 0..50 {
        match send(&client, &sim, &recipient(7), None).await.expect("answered").code() {
            0 => ok += 1,
            131056 => refused += 1,
            other => panic!("unexpected code {other}"),
        }
    }
    assert_eq!((ok, refused), (45, 5));
}

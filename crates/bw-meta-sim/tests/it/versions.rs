//! API versions (reference §0): the versions of the table are served; an expired one is not refused but
//! served by the oldest still-usable version (Meta's Platform Versioning), which the `facebook-api-version`
//! header and the counters show; a path segment that is no version is an unknown object (code 100).

use crate::common::*;
use bw_meta_sim::SimConfig;
use std::time::Duration;

async fn call(client: &reqwest::Client, sim: &bw_meta_sim::SimHandle, version: &str, n: u32) -> (Answer, String) {
    let resp = client
        .post(sim.messages_url(version, PHONE))
        .bearer_auth(TOKEN)
        .json(&text(&recipient(n), Some(&format!("op-{version}"))))
        .send()
        .await
        .expect("answered");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let served = headers.get("facebook-api-version").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let body = resp.json().await.unwrap_or(serde_json::Value::Null);
    (Answer { status, body, headers }, served)
}

#[tokio::test]
async fn usable_versions_are_served_and_a_retired_one_is_served_by_the_oldest_usable() {
    let sim = start(SimConfig { api_date: Some("2026-12-06".into()), ..config() }).await;
    let client = client(Duration::from_secs(5));
    for (i, v) in ["v21.0", "v22.0", "v23.0", "v24.0", "v25.0", "v26.0", "v27.0"].iter().enumerate() {
        let (a, served) = call(&client, &sim, v, i as u32).await;
        assert_eq!((a.status, served.as_str()), (200, *v), "{v} is usable on 2026-12-06");
    }
    // v20.0 expired on 2026-09-24: Meta serves the call with the oldest usable version, without an error.
    let (a, served) = call(&client, &sim, "v20.0", 20).await;
    assert_eq!((a.status, served.as_str()), (200, "v21.0"), "retired: remapped, not refused");
    let (a, served) = call(&client, &sim, "v17.0", 21).await;
    assert_eq!((a.status, served.as_str()), (200, "v21.0"));
    // Not a version: Graph reads the segment as an object id that does not exist.
    for bad in ["v99.0", "latest"] {
        let (a, _) = call(&client, &sim, bad, 30).await;
        assert_eq!((a.status, a.code()), (400, 100), "{bad}");
        assert_eq!(a.body["error"]["error_subcode"], 33);
    }
    let c = sim.counters();
    assert_eq!(c.api_versions.get("v20.0->v21.0"), Some(&1), "the oracle tells a remapped call");
    assert_eq!(c.api_versions.get("v17.0->v21.0"), Some(&1));
    assert_eq!(c.api_versions.get("unknown"), Some(&2));
    assert_eq!(sim.total_accepted(), 9, "unknown versions accept nothing");
}

#[tokio::test]
async fn a_version_past_its_end_date_moves_to_the_next_usable_one() {
    let sim = start(SimConfig { api_date: Some("2027-01-22".into()), ..config() }).await;
    let client = client(Duration::from_secs(5));
    let (a, served) = call(&client, &sim, "v21.0", 1).await;
    assert_eq!((a.status, served.as_str()), (200, "v22.0"), "v21.0 ended on 2027-01-21");
    let (_, served) = call(&client, &sim, "v22.0", 2).await;
    assert_eq!(served, "v22.0");
    assert!(SimConfig { api_date: Some("2027-13-01".into()), ..config() }.validate().is_err(), "a bad date");
}

//! The `quota` signal alerting's QuotaUsage rule consumes: published by the breaker library whenever a Meta
//! usage reading goes to Redis (its band changed, or it is refreshed), never per send.

use crate::support::{config, limits, manager, scope};
use bw_proto::v1::Signal;
use futures::StreamExt;
use prost::Message as _;
use std::time::Duration;

async fn next_signal(sub: &mut async_nats::Subscriber) -> Option<Signal> {
    let msg = tokio::time::timeout(Duration::from_secs(5), sub.next()).await.ok()??;
    Some(Signal::decode(msg.payload.as_ref()).expect("Signal"))
}

#[tokio::test]
async fn usage_readings_publish_a_quota_signal_when_their_band_changes() {
    let redis = bw_testkit::RedisServer::start();
    let nats = bw_testkit::NatsServer::start();
    let client = async_nats::connect(nats.url()).await.expect("nats");
    let mut sub = client.subscribe(bw_wire::names::signal_subject("quota")).await.expect("subscribe");
    client.flush().await.expect("flush");
    // The compiled default bands: slow from 80 %, pause from 90 %.
    let breaker = bw_breaker::Breaker::new(Some(manager(&redis.url()).await), Some(client.clone()), config(limits()));
    let scope = scope();

    breaker.observe_usage(&scope, 85).await;
    let s = next_signal(&mut sub).await.expect("a signal for the 80 % band");
    assert_eq!(
        (s.kind.as_str(), s.phone_number_id.as_str(), s.waba_id.as_str()),
        ("quota", scope.phone_number_id.as_str(), scope.waba_id.as_str())
    );
    assert!(s.detail.starts_with("usage 85%"), "{}", s.detail);

    // Same band within the refresh: no round trip, no signal (the next signal is 93 %'s, not 86 %'s).
    breaker.observe_usage(&scope, 86).await;
    breaker.observe_usage(&scope, 93).await;
    let s = next_signal(&mut sub).await.expect("a signal for the 90 % band");
    assert!(s.detail.starts_with("usage 93%"), "86 % (same band) must not publish: {}", s.detail);

    // Falling below 80 % publishes too, so the alert resolves.
    breaker.observe_usage(&scope, 40).await;
    let s = next_signal(&mut sub).await.expect("a signal when usage falls");
    assert!(s.detail.starts_with("usage 40%"), "{}", s.detail);
}

/// Thousands of answers come back within a reading's first round trip (a dispatcher's start, a band change):
/// the reading goes to Redis once, not once per answer. Each used to send it, and their queue on the connection
/// passed the command timeout, which took Redis for down and sent every admission to the local fallback.
#[tokio::test]
async fn a_usage_reading_goes_to_redis_once_however_many_answers_bring_it_at_once() {
    let redis = bw_testkit::RedisServer::start();
    // The compiled default breaker config.
    let breaker =
        bw_breaker::Breaker::new(Some(manager(&redis.url()).await), None, bw_breaker::BreakerConfig::default());
    let scope = scope();
    let before = breaker.round_trips();
    futures::future::join_all((0..200).map(|_| breaker.observe_no_usage(&scope))).await;
    assert_eq!(breaker.round_trips() - before, 1, "200 answers without usage headers at once");
    futures::future::join_all((0..200).map(|_| breaker.observe_usage(&scope, 95))).await;
    assert_eq!(breaker.round_trips() - before, 2, "then 200 readings in the pause band at once");
}

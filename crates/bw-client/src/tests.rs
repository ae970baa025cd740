use super::*;
use bw_testkit::NatsServer;
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

#[test]
fn builder_fills_every_field() {
    let r = Request::template("op-1", "1001", "2002", "+5491155551234", "order_update", "es_AR")
        .category(Category::Marketing)
        .param("A-1")
        .param("mañana")
        .deadline_unix_ms(42)
        .customer_last_inbound_unix_ms(7)
        .label("campaign", "spring")
        .build();
    assert_eq!((r.operation_id.as_str(), r.waba_id.as_str(), r.phone_number_id.as_str()), ("op-1", "1001", "2002"));
    assert_eq!(r.category(), Category::Marketing);
    assert_eq!((r.deadline_unix_ms, r.customer_last_inbound_unix_ms), (42, 7));
    match r.payload {
        Some(Payload::Template(t)) => {
            assert_eq!((t.name.as_str(), t.language.as_str()), ("order_update", "es_AR"));
            assert_eq!(t.body_parameters, vec!["A-1".to_string(), "mañana".to_string()]);
        }
        other => panic!("unexpected payload {other:?}"),
    }
    let t = Request::text("op-2", "1", "2", "+5491155551234", "hi").preview_url(true).param("ignored").build();
    assert_eq!(t.category(), Category::Transactional);
    assert!(matches!(t.payload, Some(Payload::Text(ref p)) if p.body == "hi" && p.preview_url));
}

fn fast() -> Options {
    Options {
        timeout: Duration::from_millis(300),
        tries: 20,
        backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(100),
    }
}

/// A fake ingest answering every request: the first `unavailable_first` answers say UNAVAILABLE.
async fn responder(nats: async_nats::Client, unavailable_first: u32, seen: Arc<AtomicU32>) {
    let mut sub = nats.subscribe(names::INTAKE_WILDCARD).await.expect("subscribe");
    tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            let request = SendRequest::decode(msg.payload.as_ref()).expect("request");
            let reply = if n <= unavailable_first {
                IntakeReply {
                    operation_id: request.operation_id,
                    reason: RejectReason::Unavailable as i32,
                    error: "ledger unavailable".into(),
                    ..Default::default()
                }
            } else {
                IntakeReply { accepted: true, operation_id: request.operation_id, ..Default::default() }
            };
            if let Some(to) = msg.reply {
                let _ = nats.publish(to, reply.encode_to_vec().into()).await;
            }
        }
    });
}

#[tokio::test]
async fn retries_no_responders_and_unavailable_with_the_same_id() {
    let server = NatsServer::start();
    let nats = async_nats::connect(server.url()).await.expect("connect");
    let client = Client::with_options(nats.clone(), fast());
    let request = Request::text("op-retry", "1", "2", "+5491155551234", "hi").build();
    let seen = Arc::new(AtomicU32::new(0));
    // Nobody listens yet: the first tries get "no responders"; the responder comes up a little later.
    let late = {
        let (nats, seen) = (nats.clone(), seen.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            responder(nats, 2, seen).await;
        })
    };
    let reply = client.send(&request).await.expect("eventually answered");
    late.await.expect("responder task");
    assert!(reply.accepted);
    assert_eq!(reply.operation_id, "op-retry");
    assert_eq!(seen.load(Ordering::SeqCst), 3, "two UNAVAILABLE answers, then accepted");
}

#[tokio::test]
async fn gives_up_with_a_clear_error() {
    let server = NatsServer::start();
    let nats = async_nats::connect(server.url()).await.expect("connect");
    let client = Client::with_options(nats, Options { tries: 2, ..fast() });
    let request = Request::text("op-none", "1", "2", "+5491155551234", "hi").build();
    let err = client.send(&request).await.expect_err("nobody listens");
    let text = err.to_string();
    assert!(text.contains("op-none") && text.contains("2 tries"), "{text}");
}

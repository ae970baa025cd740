//! Admission benchmark: decisions per second and Redis round trips per message of bw-breaker's batched design
//! (one `admit_send` + one `record_outcomes` per batch of a scope) side by side with the naive design (a check
//! script then a record script per message), against one real redis-server, plus the replay drain share.
//!
//! Run: `cargo bench -p bw-breaker --bench admission` (about 50 s). Round trips are counted exactly from
//! `INFO commandstats` deltas (eval + evalsha calls).
//!
//! The cost of the per-recipient order gate: the same batched loop with every message registered in its
//! recipient's order set (ingest's side, timed apart) and admitted through `admit_ordered` + released through
//! `record_releasing`, against the plain loop, as a ratio of admission time per message.

use bw_breaker::{
    AdmitItem, Breaker, BreakerConfig, Decision, OutcomeItem, OutcomeKind, Scope, ScopeLimits, TrafficClass,
};
use std::time::{Duration, Instant};

/// The allocator of every Breakwater binary (docs/decisions/allocator.md); libraries never set one.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TASKS: usize = 16;
const BATCH: usize = 32;
const RUN: Duration = Duration::from_secs(8);

const NAIVE_CHECK: &str = r#"
-- KEYS[1] state hash. Returns 1 allow / 0 deny. Breaker state + token bucket, one message.
local t = redis.call('TIME'); local now = t[1] * 1000 + math.floor(t[2] / 1000)
local s = redis.call('HMGET', KEYS[1], 'st', 'ou', 'tk', 'tt')
if tonumber(s[1] or 1) == 2 and now < tonumber(s[2] or 0) then return 0 end
local rate, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local tk = tonumber(s[3] or cap); local tt = tonumber(s[4] or now)
tk = math.min(cap, tk + (now - tt) * rate / 1000)
if tk < 1 then return 0 end
redis.call('HSET', KEYS[1], 'tk', tk - 1, 'tt', now)
return 1
"#;

const NAIVE_RECORD: &str = r#"
-- KEYS[1] state hash. ARGV[1] 1 failure / 0 success. Fixed 10 s window counters, trip at 50% over 50 calls.
local t = redis.call('TIME'); local now = t[1] * 1000 + math.floor(t[2] / 1000)
local w = math.floor(now / 10000)
if tonumber(redis.call('HGET', KEYS[1], 'w') or -1) ~= w then redis.call('HSET', KEYS[1], 'w', w, 'c', 0, 'f', 0) end
local c = redis.call('HINCRBY', KEYS[1], 'c', 1)
local f = redis.call('HINCRBY', KEYS[1], 'f', tonumber(ARGV[1]))
if c >= 50 and f * 2 >= c then redis.call('HSET', KEYS[1], 'st', 2, 'ou', now + 30000) end
return c
"#;

async fn script_calls(conn: &mut redis::aio::ConnectionManager) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.expect("info");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_eval:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| l.split("calls=").nth(1)?.split(',').next()?.parse::<u64>().ok())
        .sum()
}

fn open_limits() -> ScopeLimits {
    ScopeLimits { rate_per_s: 1e9, burst: 1e9, pair_burst: 1_000_000, ramp_ms: 0, ..ScopeLimits::default() }
}

/// Messages admitted and the wall time of the admission phase (admit + record for every round of every task),
/// plus the wall time of the registration phase before it (ordered runs only).
struct Run {
    n: u64,
    admit: Duration,
    register: Duration,
}

/// Rounds of BATCH messages per task in the runs with and without the order gate.
const ROUNDS: u64 = 250;

fn items_of(task: usize, round: u64) -> Vec<AdmitItem> {
    (0..BATCH)
        .map(|i| AdmitItem { recipient_key: format!("{task}-{round}-{i}"), class: TrafficClass::Marketing })
        .collect()
}

fn ops_of(task: usize, round: u64) -> Vec<String> {
    (0..BATCH).map(|i| format!("op-{task}-{round}-{i}")).collect()
}

/// The batched loop: `rounds` rounds per task (None: for RUN) of admit + record. With `ordered`, every message
/// is first registered in its recipient's order set (ingest's side, its own phase), then admitted through the
/// gate and released with its outcome.
async fn batched(conn: &redis::aio::ConnectionManager, rounds: Option<u64>, ordered: bool) -> Run {
    let breaker =
        Breaker::new(Some(conn.clone()), None, BreakerConfig { defaults: open_limits(), ..BreakerConfig::default() });
    let book = bw_breaker::OrderBook::new(bw_breaker::RedisConn::Single(conn.clone()), Duration::from_secs(2), 60_000);
    let scope_of =
        |task: usize| Scope::new(if ordered { "bench-ordered" } else { "bench" }, format!("{}", 1000 + task % 4));
    let mut register = Duration::ZERO;
    if ordered {
        let rounds = rounds.expect("ordered runs have a fixed number of rounds");
        let start = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let (book, scope) = (book.clone(), scope_of(task));
                tokio::spawn(async move {
                    for round in 0..rounds {
                        for (item, op) in items_of(task, round).iter().zip(ops_of(task, round)) {
                            book.register(&scope, &item.recipient_key, &op).await.expect("register");
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        register = start.elapsed();
    }
    let start = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let breaker = breaker.clone();
        let scope = scope_of(task);
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut round = 0u64;
            while rounds.map_or(start.elapsed() < RUN, |r| round < r) {
                let items = items_of(task, round);
                let ops = if ordered { ops_of(task, round) } else { Vec::new() };
                let a = breaker.admit_ordered(&scope, &items, &ops).await;
                assert!(!a.degraded);
                let outcomes: Vec<OutcomeItem> = items
                    .iter()
                    .zip(&a.decisions)
                    .filter(|(_, d)| matches!(d, Decision::Allow { .. }))
                    .map(|(i, _)| OutcomeItem {
                        recipient_key: i.recipient_key.clone(),
                        kind: OutcomeKind::Success,
                        canary: false,
                    })
                    .collect();
                let releases: Vec<bw_breaker::OrderRelease> = items
                    .iter()
                    .zip(&ops)
                    .zip(&a.decisions)
                    .filter(|(_, d)| matches!(d, Decision::Allow { .. }))
                    .map(|((i, op), _)| bw_breaker::OrderRelease {
                        recipient_key: i.recipient_key.clone(),
                        operation_id: op.clone(),
                    })
                    .collect();
                breaker.record_releasing(&scope, &outcomes, &releases).await;
                n += outcomes.len() as u64;
                round += 1;
            }
            n
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.expect("task");
    }
    Run { n, admit: start.elapsed(), register }
}

async fn naive(conn: &redis::aio::ConnectionManager) -> (u64, Duration) {
    let check = redis::Script::new(NAIVE_CHECK);
    let record = redis::Script::new(NAIVE_RECORD);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let mut conn = conn.clone();
        let (check, record) = (check.clone(), record.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("naive:{{{}}}", task % 4);
            let mut n = 0u64;
            while start.elapsed() < RUN {
                let allowed: i64 = check.key(&key).arg(1e9).arg(1e9).invoke_async(&mut conn).await.expect("check");
                if allowed == 1 {
                    let _: i64 = record.key(&key).arg(0).invoke_async(&mut conn).await.expect("record");
                }
                n += 1;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    (total, start.elapsed())
}

/// Replay alone drains at what share of the configured rate; then with greedy live marketing traffic.
async fn replay_share(conn: &redis::aio::ConnectionManager, with_live: bool) -> (f64, f64) {
    let limits =
        ScopeLimits { rate_per_s: 200.0, burst: 20.0, ramp_ms: 0, pair_burst: 1_000_000, ..ScopeLimits::default() };
    let breaker =
        Breaker::new(Some(conn.clone()), None, BreakerConfig { defaults: limits, ..BreakerConfig::default() });
    let scope = Scope::new("share", if with_live { "2" } else { "1" });
    let run = Duration::from_secs(4);
    let start = Instant::now();
    let pump = |class: TrafficClass| {
        let breaker = breaker.clone();
        let scope = scope.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            let mut i = 0u64;
            while start.elapsed() < run {
                i += 1;
                let item = AdmitItem { recipient_key: format!("{class:?}{i}"), class };
                match breaker.admit(&scope, &[item]).await.decisions[0] {
                    Decision::Allow { .. } => n += 1,
                    Decision::Deny { retry_after_ms, .. } => {
                        tokio::time::sleep(Duration::from_millis(retry_after_ms.clamp(1, 50))).await
                    }
                }
            }
            n
        })
    };
    let replay = pump(TrafficClass::Replay);
    let live = with_live.then(|| pump(TrafficClass::Marketing));
    let replay_n = replay.await.expect("replay") as f64;
    let live_n = match live {
        Some(l) => l.await.expect("live") as f64,
        None => 0.0,
    };
    let configured = 200.0 * start.elapsed().as_secs_f64();
    (replay_n / configured, live_n / configured)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = bw_testkit::RedisServer::start();
    let conn = bw_common::redis_conn::connect(&server.url(), Duration::from_secs(2), Duration::from_secs(5))
        .await
        .expect("redis");
    let mut stats = conn.clone();

    let before = script_calls(&mut stats).await;
    let timed = batched(&conn, None, false).await;
    let (n_batched, t_batched) = (timed.n, timed.admit);
    let rt_batched = script_calls(&mut stats).await - before;
    let plain = batched(&conn, Some(ROUNDS), false).await;
    let ordered = batched(&conn, Some(ROUNDS), true).await;
    let before = script_calls(&mut stats).await;
    let (n_naive, t_naive) = naive(&conn).await;
    let rt_naive = script_calls(&mut stats).await - before;

    let rate_b = n_batched as f64 / t_batched.as_secs_f64();
    let rate_n = n_naive as f64 / t_naive.as_secs_f64();
    println!("admission benchmark: {TASKS} concurrent tasks, one redis-server, {RUN:?} each");
    println!(
        "  batched (admit_send + record_outcomes per batch of {BATCH}): {rate_b:>10.0} decisions/s, {:.4} round trips/message ({rt_batched} script calls for {n_batched} messages)",
        rt_batched as f64 / n_batched as f64
    );
    println!(
        "  naive (check + record script per message):              {rate_n:>10.0} decisions/s, {:.4} round trips/message ({rt_naive} script calls for {n_naive} messages)",
        rt_naive as f64 / n_naive as f64
    );
    println!(
        "  ratio batched / naive: {:.1}x decisions/s, {:.1}x fewer round trips per message",
        rate_b / rate_n,
        (rt_naive as f64 / n_naive as f64) / (rt_batched as f64 / n_batched as f64)
    );
    let per_msg = |d: Duration, n: u64| d.as_secs_f64() * 1e6 / n.max(1) as f64;
    let (plain_us, ordered_us) = (per_msg(plain.admit, plain.n), per_msg(ordered.admit, ordered.n));
    println!(
        "per-recipient order gate ({ROUNDS} rounds per task, every message an order-set member, released with its outcome):"
    );
    println!(
        "  admission + recording: {plain_us:.1} µs of wall time per message without the gate, {ordered_us:.1} with it: cost ratio {:.2} (throughput {:.0} vs {:.0} messages/s)",
        ordered_us / plain_us,
        plain.n as f64 / plain.admit.as_secs_f64(),
        ordered.n as f64 / ordered.admit.as_secs_f64()
    );
    println!(
        "  ingest's registration (one round trip per message, {TASKS} tasks): {:.1} µs/message of wall time",
        per_msg(ordered.register, ordered.n)
    );
    let (alone, _) = replay_share(&conn, false).await;
    let (with_live, live) = replay_share(&conn, true).await;
    println!("replay share of a 200/s sender (burst 20, reserve 25%, headroom 2):");
    println!("  replay alone: {:.1}% of the configured rate", alone * 100.0);
    println!("  with greedy live marketing: replay {:.1}%, marketing {:.1}%", with_live * 100.0, live * 100.0);
}

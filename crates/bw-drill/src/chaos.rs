//! `--chaos SEED`: a reproducible schedule of failures during the drill. One of each: kill -9 a dispatcher
//! and restart it, kill -9 a replay worker and restart it, restart nats-server, restart redis-server. The
//! seed alone decides which instance, in what order and when (and how long a killed process stays down).

/// What one chaos event does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChaosKind {
    /// kill -9 dispatcher instance n, start it again after the down time.
    KillDispatcher(usize),
    /// kill -9 replay instance n, start it again after the down time.
    KillReplay(usize),
    /// Stop nats-server and start it again on the same port and store.
    RestartNats,
    /// Stop redis-server and start it again on the same port (no persistence: its state is gone).
    RestartRedis,
}

impl ChaosKind {
    /// Short label for the timeline and the report.
    pub fn label(self) -> String {
        match self {
            ChaosKind::KillDispatcher(n) => format!("kill -9 dispatcher-{n}"),
            ChaosKind::KillReplay(n) => format!("kill -9 replay-{n}"),
            ChaosKind::RestartNats => "restart nats-server".into(),
            ChaosKind::RestartRedis => "restart redis-server".into(),
        }
    }
}

/// One scheduled event.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChaosEvent {
    /// Seconds after the producer starts.
    pub at_s: f64,
    pub kind: ChaosKind,
    /// For kills: seconds before the process is started again.
    pub down_s: f64,
}

/// splitmix64: small, seedable, the same on every platform.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// The schedule for `seed`: four events in `[from_s, to_s)`, one per equal slot (so they never pile up), in
/// a seed-drawn order, sorted by time.
pub fn schedule(seed: u64, from_s: f64, to_s: f64, dispatchers: usize, replays: usize) -> Vec<ChaosEvent> {
    let mut rng = Rng(seed);
    let mut kinds = vec![ChaosKind::RestartNats, ChaosKind::RestartRedis];
    if dispatchers > 0 {
        kinds.push(ChaosKind::KillDispatcher(rng.below(dispatchers)));
    }
    if replays > 0 {
        kinds.push(ChaosKind::KillReplay(rng.below(replays)));
    }
    // Fisher-Yates with the seed.
    for i in (1..kinds.len()).rev() {
        let j = rng.below(i + 1);
        kinds.swap(i, j);
    }
    let span = (to_s - from_s).max(1.0);
    let slot = span / kinds.len() as f64;
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| ChaosEvent {
            // In the first two thirds of the slot: the event and its recovery finish before the next one.
            at_s: from_s + slot * (i as f64 + rng.unit() * 0.66),
            kind,
            down_s: 1.0 + rng.unit() * 2.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_alone_decides_the_schedule() {
        let a = schedule(7, 5.0, 25.0, 3, 2);
        assert_eq!(a, schedule(7, 5.0, 25.0, 3, 2), "same seed, same schedule");
        assert_ne!(a, schedule(8, 5.0, 25.0, 3, 2), "another seed, another schedule");
        assert_eq!(a.len(), 4);
        for w in a.windows(2) {
            assert!(w[0].at_s < w[1].at_s, "{a:?}");
        }
        assert!(a.iter().all(|e| (5.0..25.0).contains(&e.at_s) && (1.0..=3.0).contains(&e.down_s)));
        let has = |f: fn(&ChaosKind) -> bool| a.iter().filter(|e| f(&e.kind)).count();
        assert_eq!(has(|k| matches!(k, ChaosKind::KillDispatcher(n) if *n < 3)), 1);
        assert_eq!(has(|k| matches!(k, ChaosKind::KillReplay(n) if *n < 2)), 1);
        assert_eq!(has(|k| *k == ChaosKind::RestartNats), 1);
        assert_eq!(has(|k| *k == ChaosKind::RestartRedis), 1);
    }
}

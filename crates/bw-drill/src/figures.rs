//! Small helpers of the report's figures: quantiles and optional seconds.

/// The `p` quantile (0..1, nearest rank) of millisecond values, in seconds; None for no values.
pub fn percentile(values: &mut [u64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    let idx = ((values.len() as f64 - 1.0) * p).round() as usize;
    Some(values[idx] as f64 / 1000.0)
}

/// Seconds with one decimal, or `missing`.
pub fn secs_or(v: Option<f64>, missing: &str) -> String {
    v.map(|v| format!("{v:.1} s")).unwrap_or_else(|| missing.to_string())
}

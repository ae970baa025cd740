//! How runbook links are written in notifications; times are written by `bw_common::time`.

/// Link to a runbook file (`meta-down.md`) under the configured base, or `deploy/runbooks/` when empty.
pub(crate) fn runbook_url(base: &str, file: &str) -> String {
    let base = if base.is_empty() { "deploy/runbooks" } else { base.trim_end_matches('/') };
    format!("{base}/{file}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_runbook_links() {
        assert_eq!(runbook_url("", "meta-down.md"), "deploy/runbooks/meta-down.md");
        assert_eq!(runbook_url("https://wiki.example/rb/", "meta-down.md"), "https://wiki.example/rb/meta-down.md");
    }
}

//! The NATS users of the producers, generated from the sender registry (`bwctl senders nats-accounts`).
//!
//! `deploy/nats/accounts.conf` marks one region inside the users of the account, between the lines
//! [`BEGIN_MARKER`] and [`END_MARKER`]. [`render_accounts`] replaces what lies between them with one user per
//! tenant of the registry, keeps the markers (so its output can be the base of the next run, or go through
//! `scripts/nats-accounts.sh`), and leaves every other line as it was.
//!
//! A tenant's user (`bw_wire::tenancy::nats_user`) may do exactly what the producer contract needs and
//! nothing that would touch another tenant:
//! - publish `bw.send.v1.<phone>` and `bw.status.v1.<phone>` for each of its own numbers (never a wildcard: the
//!   subject's number decides the tenant of a request);
//! - create its one feed consumer `feed-<t>` on BW_FEED only through the create subject that carries the filter
//!   token (`$JS.API.CONSUMER.CREATE.BW_FEED.feed-<t>.bw.feed.v1.<t>.>`): the server refuses a request whose
//!   body filter differs from the subject's, so the consumer can only ever see the tenant's own subjects. The
//!   form without a filter token and `CONSUMER.DURABLE.CREATE` would accept any filter and are not granted;
//! - read that consumer (info, next, ack) and the account info; no STREAM.INFO on BW_FEED, whose subject
//!   listing would name other tenants' senders and operations;
//! - receive replies only below its own inbox prefix `_INBOX_<t>.` (ingest answers nowhere else).
//!
//! Passwords are never written: each user's password is the environment variable [`password_var`], which
//! nats-server resolves when it loads the file.

use bw_proto::v1::SenderRecord;
use bw_wire::tenancy;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The line (after indentation) that opens the generated region of the accounts config.
pub const BEGIN_MARKER: &str = "# BEGIN PRODUCERS";
/// The line (after indentation) that closes it.
pub const END_MARKER: &str = "# END PRODUCERS";

/// Why the accounts config could not be generated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AccountsError {
    #[error(
        "the base accounts config has no line `{0}` (deploy/nats/accounts.conf marks the producers' region with \
         `{BEGIN_MARKER}` and `{END_MARKER}` inside the account's users)"
    )]
    MissingMarker(&'static str),
    #[error("the base accounts config has more than one `{0}` line")]
    DuplicateMarker(&'static str),
    #[error("`{END_MARKER}` comes before `{BEGIN_MARKER}` in the base accounts config")]
    MarkersOutOfOrder,
    #[error("sender registry record of number {phone} is invalid ({why}); fix it with bwctl senders rm/add")]
    InvalidRecord { phone: String, why: String },
}

/// The environment variable holding the NATS password of `tenant`'s producer user:
/// `BW_NATS_PRODUCER_<TENANT>_PASSWORD`, the tenant upper-cased with `-` as `_` (tenants have no `_`, so no two
/// tenants share a variable).
pub fn password_var(tenant: &str) -> String {
    format!("BW_NATS_PRODUCER_{}_PASSWORD", tenant.to_ascii_uppercase().replace('-', "_"))
}

/// Every subject `tenant`'s user may publish to, given its numbers (sorted, as written in the config).
pub fn producer_publish(tenant: &str, phones: &[&str]) -> Vec<String> {
    let consumer = tenancy::feed_consumer(tenant);
    let mut allow = Vec::with_capacity(phones.len() * 2 + 5);
    for phone in phones {
        allow.push(bw_wire::names::intake_subject(phone));
        allow.push(format!("bw.status.v1.{phone}"));
    }
    allow.extend([
        "$JS.API.INFO".to_string(),
        format!("$JS.API.CONSUMER.CREATE.BW_FEED.{consumer}.{}", tenancy::feed_filter(tenant)),
        format!("$JS.API.CONSUMER.INFO.BW_FEED.{consumer}"),
        format!("$JS.API.CONSUMER.MSG.NEXT.BW_FEED.{consumer}"),
        format!("$JS.ACK.BW_FEED.{consumer}.>"),
    ]);
    allow
}

/// The only subjects `tenant`'s user may subscribe to: its own inbox prefix.
pub fn producer_subscribe(tenant: &str) -> Vec<String> {
    vec![format!("{}.>", tenancy::inbox_prefix(tenant))]
}

/// Numbers per tenant, every record checked again (the config must never carry a token the registry's rules
/// would refuse: a wildcard or a quote would widen a permission or break the file).
fn tenants(records: &[SenderRecord]) -> Result<BTreeMap<&str, Vec<&str>>, AccountsError> {
    let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for record in records {
        bw_common::registry::validate(record).map_err(|e| AccountsError::InvalidRecord {
            phone: if record.phone_number_id.bytes().all(|b| b.is_ascii_digit()) {
                record.phone_number_id.clone()
            } else {
                "(not digits)".into()
            },
            why: e.to_string(),
        })?;
        out.entry(record.tenant.as_str()).or_default().push(record.phone_number_id.as_str());
    }
    for phones in out.values_mut() {
        phones.sort_unstable();
        phones.dedup();
    }
    Ok(out)
}

/// The generated region (without the markers), each line starting with `indent`.
pub fn producer_users(records: &[SenderRecord], indent: &str) -> Result<String, AccountsError> {
    let tenants = tenants(records)?;
    let mut out = String::new();
    let quoted = |items: &[String]| items.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ");
    let _ = writeln!(
        out,
        "{indent}# Generated by `bwctl senders nats-accounts` from the sender registry: {} tenant(s). Do not edit \
         by hand;",
        tenants.len()
    );
    let _ = writeln!(out, "{indent}# register numbers with `bwctl senders add` and generate again.");
    if tenants.is_empty() {
        let _ = writeln!(out, "{indent}# No sender is registered: no producer may connect.");
    }
    for (tenant, phones) in &tenants {
        let var = password_var(tenant);
        let _ = writeln!(
            out,
            "{indent}# Tenant `{tenant}`: {} sender(s); password ${var}; inbox prefix {}; feed consumer {}.",
            phones.len(),
            tenancy::inbox_prefix(tenant),
            tenancy::feed_consumer(tenant),
        );
        let _ = writeln!(out, "{indent}{{ user: {}, password: ${var}, permissions: {{", tenancy::nats_user(tenant));
        let _ = writeln!(out, "{indent}    publish: {{ allow: [");
        let publish = producer_publish(tenant, phones);
        // Each number's two subjects on one line, then the feed consumer's.
        let (own, feed) = publish.split_at(phones.len() * 2);
        for pair in own.chunks(2) {
            let _ = writeln!(out, "{indent}      {},", quoted(pair));
        }
        for item in feed {
            let _ = writeln!(out, "{indent}      \"{item}\",");
        }
        let _ = writeln!(out, "{indent}    ] }}");
        let _ = writeln!(out, "{indent}    subscribe: {{ allow: [{}] }}", quoted(&producer_subscribe(tenant)));
        let _ = writeln!(out, "{indent}}} }}");
    }
    Ok(out)
}

/// `base` with its producers' region replaced by one user per tenant of `records` (module docs).
pub fn render_accounts(base: &str, records: &[SenderRecord]) -> Result<String, AccountsError> {
    let marker_at = |marker: &'static str| -> Result<usize, AccountsError> {
        let mut found = base.lines().enumerate().filter(|(_, l)| l.trim_start().starts_with(marker)).map(|(i, _)| i);
        let first = found.next().ok_or(AccountsError::MissingMarker(marker))?;
        if found.next().is_some() {
            return Err(AccountsError::DuplicateMarker(marker));
        }
        Ok(first)
    };
    let (begin, end) = (marker_at(BEGIN_MARKER)?, marker_at(END_MARKER)?);
    if end < begin {
        return Err(AccountsError::MarkersOutOfOrder);
    }
    let lines: Vec<&str> = base.lines().collect();
    let indent: String = lines[begin].chars().take_while(|c| c.is_whitespace()).collect();
    let mut out = String::with_capacity(base.len());
    for line in &lines[..=begin] {
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(&producer_users(records, &indent)?);
    for line in &lines[end..] {
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(phone: &str, tenant: &str) -> SenderRecord {
        SenderRecord {
            phone_number_id: phone.into(),
            waba_id: "77".into(),
            tenant: tenant.into(),
            ..Default::default()
        }
    }

    const BASE: &str = "a\n  users: [\n    { user: ingest }\n    # BEGIN PRODUCERS (generated)\n    { user: old }\n    \
                        # END PRODUCERS\n  ]\nz\n";

    #[test]
    fn password_variables_are_per_tenant() {
        assert_eq!(password_var("crm"), "BW_NATS_PRODUCER_CRM_PASSWORD");
        assert_eq!(password_var("shop-42"), "BW_NATS_PRODUCER_SHOP_42_PASSWORD");
    }

    #[test]
    fn each_tenant_gets_exactly_its_numbers_and_its_feed_consumer() {
        let out = render_accounts(BASE, &[record("2002", "shop"), record("1002", "crm"), record("1001", "crm")])
            .expect("rendered");
        assert!(out.starts_with("a\n  users: [\n    { user: ingest }\n    # BEGIN PRODUCERS (generated)\n"), "{out}");
        assert!(out.ends_with("    # END PRODUCERS\n  ]\nz\n"), "{out}");
        assert!(!out.contains("user: old"), "the old region is replaced:\n{out}");
        let crm = out.find("user: producer-crm,").expect("crm");
        let shop = out.find("user: producer-shop,").expect("shop");
        let (crm_part, shop_part) = (&out[crm..shop], &out[shop..]);
        for s in [
            "\"bw.send.v1.1001\", \"bw.status.v1.1001\",",
            "\"bw.send.v1.1002\", \"bw.status.v1.1002\",",
            "\"$JS.API.CONSUMER.CREATE.BW_FEED.feed-crm.bw.feed.v1.crm.>\"",
            "\"$JS.API.CONSUMER.INFO.BW_FEED.feed-crm\"",
            "\"$JS.API.CONSUMER.MSG.NEXT.BW_FEED.feed-crm\"",
            "\"$JS.ACK.BW_FEED.feed-crm.>\"",
            "subscribe: { allow: [\"_INBOX_crm.>\"] }",
            "password: $BW_NATS_PRODUCER_CRM_PASSWORD,",
        ] {
            assert!(crm_part.contains(s), "{s} in\n{crm_part}");
        }
        assert!(!crm_part.contains("2002") && !shop_part.contains("1001"), "no number of the other:\n{out}");
        // Never a wildcard on the intake or status subjects, no stream info, no filterless create.
        for s in ["bw.send.v1.*", "bw.status.v1.*", "STREAM.INFO", "DURABLE", "CREATE.BW_FEED\"", "_INBOX.>"] {
            assert!(!out.contains(s), "{s} granted:\n{out}");
        }
        // Rendering the output again changes nothing: it can be the next run's base.
        let again = render_accounts(&out, &[record("2002", "shop"), record("1002", "crm"), record("1001", "crm")]);
        assert_eq!(again.expect("again"), out);
    }

    #[test]
    fn an_empty_registry_leaves_no_producer() {
        let out = render_accounts(BASE, &[]).expect("rendered");
        assert!(out.contains("No sender is registered") && !out.contains("user: producer"), "{out}");
    }

    #[test]
    fn bad_bases_and_records_are_refused_with_a_reason() {
        assert_eq!(render_accounts("x\n", &[]), Err(AccountsError::MissingMarker(BEGIN_MARKER)));
        assert_eq!(render_accounts("# BEGIN PRODUCERS\n", &[]), Err(AccountsError::MissingMarker(END_MARKER)));
        assert_eq!(render_accounts("# END PRODUCERS\n# BEGIN PRODUCERS\n", &[]), Err(AccountsError::MarkersOutOfOrder));
        let twice = "# BEGIN PRODUCERS\n# BEGIN PRODUCERS\n# END PRODUCERS\n";
        assert_eq!(render_accounts(twice, &[]), Err(AccountsError::DuplicateMarker(BEGIN_MARKER)));
        // A record that would widen a permission (a wildcard number, a tenant with a dot) is never written.
        for bad in [record("*", "crm"), record("1001", "crm.>"), record("10\"01", "crm")] {
            let err = render_accounts(BASE, &[bad]).expect_err("refused");
            assert!(matches!(err, AccountsError::InvalidRecord { .. }), "{err}");
        }
    }
}

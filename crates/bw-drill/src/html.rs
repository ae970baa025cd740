//! `report.html`: one self-contained page a person reads (no external files, no scripts needed to read it):
//! header, summary cards, the timeline, error answers by code (injected / self-inflicted), a per-sender table,
//! alerts with fired and resolved times in UTC and in the display zone, and the validation matrix.
//!
//! The page is laid out to fit its window's width: cards wrap, the SVG scales, tables have fixed layout and
//! break long words. A small inline script records whether anything overflows horizontally in the element
//! `#layout-check` (`data-overflow="none"` or the widths), which the rendering test reads back.

use crate::chart::escape;
use crate::model::{DrillReport, Status};

const STYLE: &str = "
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;padding:16px;color:#222;background:#fff;max-width:1200px}
h1{font-size:1.5em;margin:0 0 8px} h2{font-size:1.15em;margin:24px 0 8px;border-bottom:1px solid #ddd;padding-bottom:4px}
.result{display:inline-block;padding:4px 10px;border-radius:4px;font-weight:bold;color:#fff}
.pass{background:#2e7d32} .fail{background:#c62828}
dl.header{display:grid;grid-template-columns:minmax(8em,max-content) 1fr;gap:2px 12px;margin:8px 0}
dl.header dt{font-weight:600} dl.header dd{margin:0;overflow-wrap:anywhere}
.cards{display:flex;flex-wrap:wrap;gap:10px}
.card{flex:1 1 150px;min-width:0;border:1px solid #ddd;border-radius:6px;padding:10px;background:#fafafa}
.card .v{font-size:1.5em;font-weight:600} .card .k{color:#555;font-size:.85em;overflow-wrap:anywhere}
.card.bad{border-color:#c62828;background:#fdecea}
table{width:100%;border-collapse:collapse;table-layout:fixed;font-size:.9em}
th,td{border:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top;overflow-wrap:anywhere;word-break:break-word}
th{background:#f0f0f0}
td.num{text-align:right}
.passed{color:#2e7d32;font-weight:600} .failed{color:#c62828;font-weight:600} .pending{color:#9a6700;font-weight:600}
figure{margin:0} svg{max-width:100%;height:auto;display:block}
.note{color:#555;font-size:.9em}
";

const CHECK_SCRIPT: &str = "
(function(){
  var d=document.documentElement, el=document.getElementById('layout-check');
  var wide=[];
  document.querySelectorAll('body *').forEach(function(n){
    var r=n.getBoundingClientRect(); if(r.right>d.clientWidth+1){wide.push(n.tagName+(n.id?'#'+n.id:''));}
  });
  var ok=d.scrollWidth<=d.clientWidth && wide.length===0;
  el.setAttribute('data-overflow', ok?'none':('scroll '+d.scrollWidth+' client '+d.clientWidth+' '+wide.slice(0,5).join(',')));
  el.textContent = ok ? 'layout-ok' : 'layout-overflow';
})();
";

fn card(out: &mut String, key: &str, value: String, bad: bool) {
    out.push_str(&format!(
        "<div class=\"card{}\"><div class=\"v\">{}</div><div class=\"k\">{}</div></div>\n",
        if bad { " bad" } else { "" },
        escape(&value),
        escape(key)
    ));
}

fn secs(v: Option<f64>) -> String {
    crate::figures::secs_or(v, "n/a")
}

/// The page. `svg` is the timeline from [`crate::chart::render`].
pub fn page(r: &DrillReport, svg: &str) -> String {
    let mut s = String::with_capacity(64 * 1024);
    s.push_str("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n");
    s.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n");
    s.push_str(&format!("<title>Breakwater drill report</title>\n<style>{STYLE}</style></head><body>\n"));
    s.push_str("<h1>Breakwater drill report</h1>\n");
    let (class, word) = if r.passed() { ("pass", "PASS") } else { ("fail", "FAIL") };
    s.push_str(&format!(
        "<p><span class=\"result {class}\" id=\"result\">{word}</span> <span class=\"note\">PASS needs 0 lost, \
         0 unflagged duplicates and 0 self-inflicted rate-limit answers.</span></p>\n"
    ));

    let h = &r.header;
    s.push_str("<section id=\"header\"><dl class=\"header\">\n");
    for (k, v) in [
        ("Environment", h.environment.clone()),
        ("Version", h.version.clone()),
        ("Date and time", h.started_utc.clone()),
        ("Scenario", h.scenario.clone()),
        ("Load", h.load.clone()),
        ("Duration", format!("{:.0} s", h.duration_s)),
        ("Expected", h.expected.clone()),
        ("Observed", h.observed.clone()),
    ] {
        s.push_str(&format!("<dt>{}</dt><dd>{}</dd>\n", escape(k), escape(&v)));
    }
    s.push_str("</dl></section>\n");

    s.push_str("<section id=\"summary\"><h2>Summary</h2><div class=\"cards\">\n");
    card(&mut s, "accepted (of requested)", format!("{} / {}", r.accepted, r.requested), r.accepted < r.requested);
    card(&mut s, "lost", r.lost.to_string(), r.lost > 0);
    card(
        &mut s,
        "duplicates at Meta: unflagged / flagged",
        format!("{} / {}", r.duplicates_unflagged(), r.duplicates_flagged_unknown),
        r.duplicates_unflagged() > 0,
    );
    card(
        &mut s,
        "rate-limit answers: self-inflicted / injected",
        format!("{} / {}", r.errors.rate_limit_self_inflicted(), r.errors.rate_limit_injected()),
        r.errors.rate_limit_self_inflicted() > 0,
    );
    card(&mut s, "time to trip after the outage began", secs(r.time_to_trip_s), false);
    card(&mut s, "time to close after recovery", secs(r.time_to_close_s), false);
    card(&mut s, "DLQ drain after the first close", secs(r.replay_drain_s), false);
    card(&mut s, "breaker trips", r.breaker_trips.to_string(), false);
    card(&mut s, "max DLQ depth", r.max_dlq_depth.to_string(), false);
    card(&mut s, "replayed operations", r.replayed.to_string(), false);
    s.push_str("</div>\n");
    s.push_str(&format!(
        "<p class=\"note\">Final states: sent {}, delivered {}, read {}, failed {}, quarantined {}, expired {}, \
         unknown {}, in DLQ {}, queued {}.</p></section>\n",
        r.sent, r.delivered, r.read, r.failed, r.quarantined, r.expired, r.unknown, r.in_dlq, r.queued
    ));

    s.push_str("<section id=\"timeline\"><h2>Timeline</h2><figure>\n");
    s.push_str(svg);
    s.push_str("</figure>\n");
    if !r.chaos.is_empty() {
        s.push_str("<p class=\"note\">Chaos events: ");
        let list: Vec<String> = r.chaos.iter().map(|(t, l)| format!("{} at {t:.1} s", escape(l))).collect();
        s.push_str(&list.join("; "));
        s.push_str(".</p>\n");
    }
    s.push_str("</section>\n");

    s.push_str("<section id=\"errors\"><h2>Error answers from Meta</h2>\n");
    s.push_str(&format!(
        "<p class=\"note\">Split source: {}. Self-inflicted: a limit exceeded by our own sending.</p>\n",
        escape(r.errors.source.label())
    ));
    s.push_str("<table><thead><tr><th>code</th><th>kind</th><th>total</th><th>injected</th><th>self-inflicted / not injected</th></tr></thead><tbody>\n");
    if r.errors.codes.is_empty() {
        s.push_str("<tr><td colspan=\"5\">no error answers</td></tr>\n");
    }
    for c in &r.errors.codes {
        s.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num{}\">{}</td></tr>\n",
            escape(&c.key),
            if c.rate_limit { "rate limit" } else { "other" },
            c.total,
            c.injected,
            if c.rate_limit && c.self_inflicted > 0 { " failed" } else { "" },
            c.self_inflicted
        ));
    }
    s.push_str("</tbody></table></section>\n");

    s.push_str("<section id=\"categories\"><h2>Per category</h2>\n<table><thead><tr><th>category</th><th>messages</th><th>accepted by Meta</th><th>expired</th><th>ingest → Meta p50 / p99</th><th>dead-lettered</th><th>dead-lettered p50 / p99</th><th>last dead-lettered after recovery</th><th>order violations</th></tr></thead><tbody>\n");
    for c in &r.journey.categories {
        s.push_str(&format!(
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{} / {}</td><td class=\"num\">{}</td><td class=\"num\">{} / {}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>\n",
            escape(&c.category),
            c.messages,
            c.accepted_by_meta,
            c.expired,
            secs(c.delay_p50_s),
            secs(c.delay_p99_s),
            c.dead_lettered,
            secs(c.dead_lettered_delay_p50_s),
            secs(c.dead_lettered_delay_p99_s),
            secs(c.last_dead_lettered_after_recovery_s),
            c.order_violations
        ));
    }
    s.push_str(&format!(
        "</tbody></table><p>Dead-lettered priority messages accepted later than (backlog ÷ sender rate) + 5 s after their sender closed: {} of {}. Live promotions accepted while a dead-lettered priority message of the same sender waited: {}. Authentication does not keep per-recipient order (an OTP never waits behind a promotion), so its violations are expected.</p></section>\n",
        r.journey.priority_late, r.journey.priority_checked, r.journey.promotions_ahead_of_priority
    ));

    s.push_str("<section id=\"senders\"><h2>Per sender</h2>\n<table><colgroup><col style=\"width:22%\"><col><col><col><col><col><col><col></colgroup><thead><tr><th>sender</th><th>accepted by Meta</th><th>sent outcomes</th><th>DLQ moves</th><th>rate-limited</th><th>error answers</th><th>trips</th><th>breaker at end</th></tr></thead><tbody>\n");
    for p in &r.per_sender {
        s.push_str(&format!(
            "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td></tr>\n",
            escape(&p.sender),
            p.accepted_by_meta,
            p.sent,
            p.dlq_moves,
            p.rate_limited,
            p.error_answers,
            p.trips,
            escape(&p.final_breaker)
        ));
    }
    s.push_str("</tbody></table></section>\n");

    let zone = bw_common::time::parse_zone(&r.zone).ok();
    let when = |ms: i64| -> String {
        if ms <= 0 {
            return "still firing".into();
        }
        let local = zone.map(|z| bw_common::time::format_local(ms, z)).unwrap_or_default();
        format!("{}<br>{}", escape(&bw_common::time::format_utc(ms)), escape(&local))
    };
    s.push_str(&format!(
        "<section id=\"alerts\"><h2>Alerts</h2>\n<p class=\"note\">Times as DD/MM/YYYY HH:MM:SS (24 h) in UTC and in {}.</p>\n",
        escape(&r.zone)
    ));
    s.push_str("<table><thead><tr><th>alert</th><th>severity</th><th>summary</th><th>fired</th><th>resolved</th></tr></thead><tbody>\n");
    if r.alerts.is_empty() {
        s.push_str("<tr><td colspan=\"5\">no alerts</td></tr>\n");
    }
    for a in &r.alerts {
        s.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            escape(&a.dedup_key),
            escape(&a.severity),
            escape(&a.summary),
            when(a.started_at_unix_ms),
            when(a.resolved_at_unix_ms)
        ));
    }
    s.push_str("</tbody></table></section>\n");

    s.push_str("<section id=\"validation\"><h2>Validation matrix</h2>\n<p class=\"note\">A row whose evidence this run did not measure is pending, never passed.</p>\n");
    s.push_str("<table><colgroup><col style=\"width:9%\"><col style=\"width:20%\"><col style=\"width:18%\"><col style=\"width:31%\"><col style=\"width:9%\"><col style=\"width:13%\"></colgroup>\n");
    s.push_str("<thead><tr><th>row</th><th>control</th><th>pass criterion</th><th>evidence</th><th>status</th><th>owner</th></tr></thead><tbody>\n");
    for v in &r.validation {
        let class = match v.status {
            Status::Passed => "passed",
            Status::Failed => "failed",
            Status::Pending => "pending",
        };
        s.push_str(&format!(
            "<tr id=\"v-{}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"{class}\">{}</td><td>{}</td></tr>\n",
            v.key,
            v.key,
            escape(&v.control),
            escape(&v.criterion),
            escape(&v.evidence),
            v.status.label(),
            escape(&v.owner)
        ));
    }
    s.push_str("</tbody></table></section>\n");
    s.push_str("<div id=\"layout-check\" class=\"note\" data-overflow=\"unchecked\"></div>\n");
    s.push_str(&format!("<script>{CHECK_SCRIPT}</script>\n</body></html>\n"));
    s
}

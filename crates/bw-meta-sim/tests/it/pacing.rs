//! The shipped `scenarios/template-pacing.toml`: it parses strictly and holds each signal of template pacing and
//! Meta's rate changes a sender must follow (reference §3.1, §3.5, §4.5), in order.

use bw_meta_sim::Scenario;

#[test]
fn the_template_pacing_scenario_emits_each_rate_and_template_signal() {
    let scenario = Scenario::from_toml(include_str!("../../scenarios/template-pacing.toml")).expect("parses strictly");
    assert_eq!(scenario.name, "template-pacing");
    let kinds: Vec<(&str, u64)> = scenario.events.iter().map(|e| (e.kind.kind_name(), e.at_ms)).collect();
    assert_eq!(
        kinds,
        vec![
            ("template_pacing", 5_000),
            ("message_template_quality_update", 20_000),
            ("message_template_status_update", 20_000),
            ("phone_number_quality_update", 30_000),
            ("template_category_update", 40_000),
            ("template_category_update", 45_000),
            ("message_template_status_update", 90_000),
            ("message_template_quality_update", 90_000),
        ]
    );
    let pause = serde_json::to_value(&scenario.events[2]).expect("serialises");
    assert_eq!(pause["title"], "RATE_LIMITING_PAUSE", "a pacing pause: {pause}");
}

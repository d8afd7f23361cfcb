//! The Grafana dashboard and the recording rules in `deploy/` name only series the
//! device plugin exports. The exported names come from a live scrape of the plugin (its
//! `# TYPE` lines: a counter `x` is exported as `x_total`), never from a hand list, so
//! a renamed or removed series fails this test.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::{CORE, MEMORY, Plugin, TestKubelet, http_get};
use vgpu_node_agent::devices::FakeSource;

/// The series names a scrape exports, from its `# TYPE` lines.
fn exported(metrics: &str) -> BTreeSet<String> {
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            let (name, kind) = (words.next()?, words.next()?);
            Some(match kind {
                "counter" => format!("{name}_total"),
                _ => name.to_string(),
            })
        })
        .collect()
}

/// PromQL's functions, aggregations and keywords: what a query names that is no series.
const PROMQL_WORDS: &[&str] = &[
    "abs",
    "absent",
    "avg",
    "avg_over_time",
    "bool",
    "bottomk",
    "by",
    "ceil",
    "clamp",
    "clamp_max",
    "clamp_min",
    "count",
    "delta",
    "deriv",
    "floor",
    "group_left",
    "group_right",
    "histogram_quantile",
    "ignoring",
    "increase",
    "irate",
    "label_replace",
    "label_join",
    "label_values",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "offset",
    "on",
    "quantile",
    "rate",
    "round",
    "scalar",
    "sort",
    "sort_desc",
    "stddev",
    "sum",
    "sum_over_time",
    "topk",
    "vector",
    "without",
    "and",
    "or",
    "unless",
    "time",
];

/// The series names a PromQL expression (or Grafana variable query) mentions: what is
/// left once strings, label matchers, ranges and grouping clauses are taken out, and
/// that is no function or keyword.
fn series_in(expr: &str) -> BTreeSet<String> {
    // Grafana's `label_values(series, label)`: the second argument is a label.
    let trimmed = expr.trim();
    let expr = match trimmed.strip_prefix("label_values(") {
        Some(inner) => inner.rsplit_once(',').map_or(inner, |(series, _)| series),
        None => expr,
    };
    let mut text = String::new();
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    let mut in_string = false;
    for c in expr.chars() {
        match c {
            '"' => in_string = !in_string,
            _ if in_string => {}
            '{' => depth_brace += 1,
            '}' => depth_brace -= 1,
            '[' => depth_bracket += 1,
            ']' => depth_bracket -= 1,
            _ if depth_brace > 0 || depth_bracket > 0 => {}
            c => text.push(c),
        }
    }
    // `by (a, b)`, `without (..)`, `on (..)`, `ignoring (..)`, `group_left (..)`: labels.
    let mut cleaned = String::new();
    let mut rest = text.as_str();
    while let Some(at) = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ]
    .iter()
    .filter_map(|word| {
        rest.match_indices(word).find(|(at, _)| {
            let before = rest[..*at].chars().last();
            let after = rest[at + word.len()..].trim_start();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && after.starts_with('(')
        })
    })
    .map(|(at, word)| (at, word.len()))
    .min()
    {
        cleaned.push_str(&rest[..at.0]);
        let after = &rest[at.0 + at.1..];
        let close = after.find(')').map_or(after.len(), |i| i + 1);
        rest = &after[close..];
    }
    cleaned.push_str(rest);
    let mut names = BTreeSet::new();
    let chars: Vec<char> = cleaned.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_alphabetic() || c == '_' || c == ':' || c == '$' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_:$".contains(chars[i]))
            {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let next = chars[i..].iter().find(|c| !c.is_whitespace());
            let is_call = next == Some(&'(');
            let numeric_before = start > 0 && chars[start - 1].is_ascii_digit();
            if !is_call
                && !word.starts_with('$')
                && !numeric_before
                && !PROMQL_WORDS.contains(&word.as_str())
                && !["e", "Inf", "NaN", "inf", "nan"].contains(&word.as_str())
            {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every `expr` string of a dashboard, and the query of every template variable.
fn queries(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "definition", serde_json::Value::String(text)) => {
                        out.push(text.clone())
                    }
                    ("query", serde_json::Value::String(text)) if text.contains('(') => {
                        out.push(text.clone())
                    }
                    _ => queries(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| queries(item, out)),
        _ => {}
    }
}

async fn scrape_exported() -> BTreeSet<String> {
    let kubelet = TestKubelet::start().await;
    let mut plugin = Plugin::start(
        &kubelet,
        kubelet.plugin_config(),
        Arc::new(FakeSource::uniform(1, 8 << 30)),
    )
    .await;
    kubelet
        .admit_and_start(
            &mut plugin,
            "team",
            "job",
            "main",
            &[(CORE, 20), (MEMORY, 4)],
        )
        .await;
    let address = plugin.handle.metrics_address().expect("metrics");
    let (code, metrics) = http_get(address, "/metrics").await;
    assert_eq!(code, 200);
    plugin.handle.stop().await;
    exported(&metrics)
}

fn repo_file(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|err| panic!("{path}: {err}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_and_recording_rule_names_an_exported_series() {
    let exported = scrape_exported().await;
    for name in [
        "vgpu_container_memory_refusals_total",
        "vgpu_container_memory_refused_bytes_total",
        "vgpu_container_throttled_seconds_total",
        "vgpu_container_memory_limit_bytes",
    ] {
        assert!(exported.contains(name), "{name} not in {exported:?}");
    }

    let dashboard: serde_json::Value =
        serde_json::from_str(&repo_file("deploy/grafana-dashboard.json")).expect("JSON");
    let mut found = Vec::new();
    queries(&dashboard, &mut found);
    assert!(found.len() >= 10, "{found:?}");
    let mut named = BTreeSet::new();
    for query in &found {
        let series = series_in(query);
        assert!(!series.is_empty(), "a query that names no series: {query}");
        for name in series {
            assert!(
                exported.contains(&name),
                "the dashboard's `{query}` names {name}, which the plugin does not export ({exported:?})"
            );
            named.insert(name);
        }
    }
    // The new series are on the dashboard.
    for name in [
        "vgpu_container_memory_refusals_total",
        "vgpu_container_throttled_seconds_total",
    ] {
        assert!(named.contains(name), "{name} is on no panel");
    }

    let rules: serde_json::Value =
        serde_saphyr::from_str(&repo_file("deploy/prometheus-rules.yaml")).expect("YAML");
    let groups = rules["groups"].as_array().expect("groups");
    let mut records = BTreeSet::new();
    for rule in groups
        .iter()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
    {
        let record = rule["record"].as_str().expect("record").to_string();
        let expr = rule["expr"].as_str().expect("expr");
        assert!(
            record.starts_with("hami_") || record.starts_with("DCGM_FI_"),
            "{record}: the rules map onto HAMi's and dcgm-exporter's names only"
        );
        assert!(
            expr.contains(r#""exporter", "vgpu-shim""#),
            "{record} must carry exporter=\"vgpu-shim\""
        );
        let series = series_in(expr);
        assert!(!series.is_empty(), "{record} names no series");
        for name in series {
            assert!(
                exported.contains(&name),
                "{record} uses {name}, not exported"
            );
        }
        records.insert(record);
    }
    for record in [
        "hami_vgpu_memory_used_bytes",
        "hami_vgpu_memory_limit_bytes",
        "hami_container_device_utilization_ratio",
        "DCGM_FI_DEV_FB_TOTAL",
    ] {
        assert!(records.contains(record), "{record} missing");
    }
}

#[test]
fn the_query_reader_finds_series_and_nothing_else() {
    let names = |expr: &str| series_in(expr).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(r#"100 * rate(a_total{namespace=~"$ns", pod="x{y}"}[$__rate_interval]) / b"#),
        ["a_total", "b"]
    );
    assert_eq!(
        names("sum by (event, UUID) (increase(c_total[5m])) and on (UUID) d_bytes offset 1h"),
        ["c_total", "d_bytes"]
    );
    assert_eq!(
        names("label_values(vgpu_x{namespace=~\"$namespace\"}, pod)"),
        ["vgpu_x"]
    );
    assert_eq!(names("1e9 * e_total"), ["e_total"]);
}

//! One series' value from a Prometheus text exposition, as the metrics tests read it.

/// The value of `name{labels}` (labels written exactly as exposed, without braces) in
/// `metrics`; `None` when the series is absent or its value is no number.
pub fn metric_value(metrics: &str, name: &str, labels: &str) -> Option<f64> {
    let prefix = format!("{name}{{{labels}}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_exactly_the_series_named() {
        let text = "# HELP x\nx_total{a=\"1\",b=\"2\"} 3.5\nx_total{a=\"1\"} 7\nx_total_bytes{a=\"1\"} 9\n";
        assert_eq!(metric_value(text, "x_total", r#"a="1",b="2""#), Some(3.5));
        assert_eq!(metric_value(text, "x_total", r#"a="1""#), Some(7.0));
        assert_eq!(metric_value(text, "x_total", r#"a="2""#), None);
        assert_eq!(metric_value(text, "x", r#"a="1""#), None);
    }
}

//! Reading Kubernetes manifests in the tests of `deploy/` and of the Helm chart: YAML
//! documents as JSON values, an object by kind, a ClusterRole's rules.
#![allow(dead_code)]

use serde::Deserialize;
use serde_json::Value;

/// The documents of a multi-document YAML text, as JSON (empty documents left out).
pub fn parse(text: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(text)
        .map(|doc| {
            let yaml = serde_norway::Value::deserialize(doc).expect("YAML document");
            serde_json::to_value(yaml).expect("as JSON")
        })
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The first object of `kind`.
pub fn of_kind<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|doc| doc["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

/// The ClusterRole's rules as (apiGroups, resources, verbs), groups and resources
/// joined with commas.
pub fn cluster_role_rules(docs: &[Value]) -> Vec<(String, String, Vec<String>)> {
    of_kind(docs, "ClusterRole")["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|rule| {
            let words = |key: &str| -> Vec<String> {
                rule[key]
                    .as_array()
                    .expect(key)
                    .iter()
                    .map(|v| v.as_str().expect("string").to_string())
                    .collect()
            };
            (
                words("apiGroups").join(","),
                words("resources").join(","),
                words("verbs"),
            )
        })
        .collect()
}

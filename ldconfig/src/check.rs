//! The export check: every symbol the real driver library exports must also be
//! exported by the shim that replaces it, or an application that resolves it (directly,
//! through `dlsym` or through `cuGetProcAddress`) fails with "function not found".

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;

/// The exports of `real` that `shim` lacks, sorted.
pub fn missing_exports(real: &BTreeSet<String>, shim: &BTreeSet<String>) -> Vec<String> {
    real.difference(shim).cloned().collect()
}

/// The outcome of checking one shim against one real library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    /// What the real side was (a library path or a symbols list).
    pub real: String,
    /// The shim that was checked.
    pub shim: String,
    /// How many names the real side exports.
    pub real_count: usize,
    /// How many names the shim exports.
    pub shim_count: usize,
    /// Names of the real side missing from the shim, sorted.
    pub missing: Vec<String>,
}

impl CheckReport {
    /// Compares two export sets; `real` and `shim` label them in messages.
    pub fn compare(
        real: impl Into<String>,
        real_exports: &BTreeSet<String>,
        shim: impl Into<String>,
        shim_exports: &BTreeSet<String>,
    ) -> Self {
        CheckReport {
            real: real.into(),
            shim: shim.into(),
            real_count: real_exports.len(),
            shim_count: shim_exports.len(),
            missing: missing_exports(real_exports, shim_exports),
        }
    }

    /// True when the shim exports everything the real side does.
    pub fn is_complete(&self) -> bool {
        self.missing.is_empty()
    }
}

impl fmt::Display for CheckReport {
    /// One summary line, e.g. `shim x exports all 620 names of y (640 exports)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_complete() {
            write!(
                f,
                "{} exports all {} names of {} ({} exports)",
                self.shim, self.real_count, self.real, self.shim_count
            )
        } else {
            write!(
                f,
                "{} lacks {} of the {} exports of {}: {}",
                self.shim,
                self.missing.len(),
                self.real_count,
                self.real,
                self.missing.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn reports_only_names_the_shim_lacks_sorted() {
        let real = set(&["cuMemAlloc_v2", "cuInit", "cuDriverGetVersion"]);
        let shim = set(&["cuInit", "vgpuExtra"]);
        assert_eq!(
            missing_exports(&real, &shim),
            ["cuDriverGetVersion", "cuMemAlloc_v2"]
        );
        let report = CheckReport::compare("real.so", &real, "shim.so", &shim);
        assert!(!report.is_complete());
        assert_eq!(report.real_count, 3);
        assert_eq!(report.shim_count, 2);
        assert!(report.to_string().contains("lacks 2 of the 3"));
    }

    #[test]
    fn superset_shim_is_complete() {
        let real = set(&["cuInit"]);
        let shim = set(&["cuInit", "cuGetProcAddress"]);
        let report = CheckReport::compare("real", &real, "shim", &shim);
        assert!(report.is_complete());
        assert_eq!(
            report.to_string(),
            "shim exports all 1 names of real (2 exports)"
        );
    }
}

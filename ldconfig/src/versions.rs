//! The driver folder as a set of prepared versions, one switched `current`:
//!
//! ```text
//! BASE/535.261.03/            prepared for driver 535 (lib64/, bin/, shim/, driver.json)
//! BASE/580.159.04/            prepared for driver 580
//! BASE/current -> 580.159.04  replaced in one rename
//! ```
//!
//! A host driver upgrade never rewrites a folder that running containers have mounted:
//! the next preparation fills a new version folder, then points `current` at it. The
//! device plugin mounts the folder `current` names at Allocate ([`prepared_dir`]), so a
//! container keeps the version it started with for its whole life; the previous
//! version is kept ([`prune`] removes older ones), so containers started before the
//! upgrade find their files until they are replaced too.

use std::path::{Path, PathBuf};

use crate::discover::is_version;

/// The link naming the version in use.
pub const CURRENT_LINK: &str = "current";

/// The version folder `BASE/current` names, when it is a link to a version folder.
pub fn current_version(base: &Path) -> Option<String> {
    let target = std::fs::read_link(base.join(CURRENT_LINK)).ok()?;
    let name = target.to_str()?;
    (is_version(name) && base.join(name).is_dir()).then(|| name.to_string())
}

/// The folder to mount for `base`: `BASE/<version>` that `current` names, or `base`
/// itself when it has no `current` (a folder laid out by hand, or by a `vgpu-ldconfig`
/// before versioned folders).
pub fn prepared_dir(base: &Path) -> PathBuf {
    match current_version(base) {
        Some(version) => base.join(version),
        None => base.to_path_buf(),
    }
}

/// `path` with a leading `base` (or `base/current`) replaced by [`prepared_dir`]`(base)`:
/// paths configured inside the driver folder follow the `current` link.
pub fn follow_current(base: &Path, path: &Path) -> PathBuf {
    let resolved = prepared_dir(base);
    let inside = path
        .strip_prefix(base.join(CURRENT_LINK))
        .or_else(|_| path.strip_prefix(base));
    match inside {
        Ok(rest) => resolved.join(rest),
        Err(_) => path.to_path_buf(),
    }
}

/// Points `BASE/current` at `version` in one rename; returns the version it named before.
pub fn switch_current(base: &Path, version: &str) -> std::io::Result<Option<String>> {
    let before = current_version(base);
    if before.as_deref() == Some(version) {
        return Ok(before);
    }
    let link = base.join(CURRENT_LINK);
    if std::fs::symlink_metadata(&link).is_ok_and(|meta| !meta.file_type().is_symlink()) {
        return Err(std::io::Error::other(format!(
            "{} is not a link; remove it",
            link.display()
        )));
    }
    let staging = base.join(format!(".{CURRENT_LINK}.vgpu-tmp-{}", std::process::id()));
    let _ = std::fs::remove_file(&staging);
    std::os::unix::fs::symlink(version, &staging)?;
    std::fs::rename(&staging, &link)?;
    Ok(before)
}

/// Version folders in `base` (plain folders named like a version), newest preparation first.
pub fn versions(base: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(base) else {
        return Vec::new();
    };
    let mut found: Vec<(std::time::SystemTime, String)> = entries
        .flatten()
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            is_version(&name).then_some(name)
        })
        .map(|name| {
            let stamp = std::fs::metadata(base.join(&name).join(crate::prepare::MANIFEST_FILE))
                .and_then(|meta| meta.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            (stamp, name)
        })
        .collect();
    found.sort_by(|a, b| b.cmp(a));
    found.into_iter().map(|(_, name)| name).collect()
}

/// Removes version folders beyond the current one, `previous` (the one current named
/// before, kept first) and the `keep` newest others in all; returns the removed versions.
pub fn prune(base: &Path, previous: Option<&str>, keep: usize) -> std::io::Result<Vec<String>> {
    let current = current_version(base);
    let mut others: Vec<String> = versions(base)
        .into_iter()
        .filter(|version| Some(version.as_str()) != current.as_deref())
        .collect();
    if let Some(previous) = previous
        && let Some(at) = others.iter().position(|version| version == previous)
    {
        let kept = others.remove(at);
        others.insert(0, kept);
    }
    let mut removed = Vec::new();
    for version in others.into_iter().skip(keep) {
        std::fs::remove_dir_all(base.join(&version))?;
        removed.push(version);
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version_dir(base: &Path, version: &str, age_secs: u64) {
        let dir = base.join(version);
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = dir.join(crate::prepare::MANIFEST_FILE);
        std::fs::write(&manifest, "{}").unwrap();
        let stamp = std::time::SystemTime::now() - std::time::Duration::from_secs(age_secs);
        std::fs::File::options()
            .write(true)
            .open(&manifest)
            .unwrap()
            .set_modified(stamp)
            .unwrap();
    }

    #[test]
    fn current_switches_in_one_rename_and_paths_follow_it() {
        let base = tempfile::tempdir().unwrap();
        let base = base.path();
        assert_eq!(prepared_dir(base), base, "no current: the folder itself");
        version_dir(base, "535.261.03", 100);
        assert_eq!(switch_current(base, "535.261.03").unwrap(), None);
        assert_eq!(prepared_dir(base), base.join("535.261.03"));
        version_dir(base, "580.159.04", 10);
        assert_eq!(
            switch_current(base, "580.159.04").unwrap().as_deref(),
            Some("535.261.03")
        );
        assert_eq!(
            std::fs::read_link(base.join("current")).unwrap(),
            Path::new("580.159.04")
        );
        assert_eq!(
            follow_current(base, &base.join("shim/libcuda_shim.so")),
            base.join("580.159.04/shim/libcuda_shim.so")
        );
        assert_eq!(
            follow_current(base, &base.join("current/lib64/libnvidia-ml.so.1")),
            base.join("580.159.04/lib64/libnvidia-ml.so.1")
        );
        assert_eq!(
            follow_current(base, Path::new("/opt/other")),
            Path::new("/opt/other")
        );
        // No stray staging link.
        let names: Vec<String> = std::fs::read_dir(base)
            .unwrap()
            .flatten()
            .map(|entry| entry.file_name().into_string().unwrap())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
        // A folder where the link should be is refused, not replaced.
        let odd = tempfile::tempdir().unwrap();
        std::fs::create_dir(odd.path().join("current")).unwrap();
        version_dir(odd.path(), "1.2.3", 0);
        assert!(switch_current(odd.path(), "1.2.3").is_err());
        assert_eq!(prepared_dir(odd.path()), odd.path());
    }

    #[test]
    fn prune_keeps_current_and_previous() {
        let base = tempfile::tempdir().unwrap();
        let base = base.path();
        version_dir(base, "470.1.1", 400);
        version_dir(base, "535.261.03", 300);
        version_dir(base, "550.1.2", 200);
        version_dir(base, "580.159.04", 10);
        std::fs::create_dir(base.join("not-a-version")).unwrap();
        switch_current(base, "580.159.04").unwrap();
        assert_eq!(versions(base)[0], "580.159.04");
        // 535 was current before: it stays although 550 is newer.
        let removed = prune(base, Some("535.261.03"), 1).unwrap();
        assert_eq!(removed, ["550.1.2", "470.1.1"]);
        assert!(base.join("580.159.04").is_dir());
        assert!(base.join("535.261.03").is_dir());
        assert!(base.join("not-a-version").is_dir(), "only version folders");
        assert!(prune(base, None, 1).unwrap().is_empty());
        assert_eq!(prune(base, None, 0).unwrap(), ["535.261.03"]);
    }
}

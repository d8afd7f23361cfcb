//! Where a Cargo build left one of the workspace's shared libraries or programs, for
//! `vgpu` run from a target folder and for the tests: `cargo build` puts them in
//! `target/<profile>/`, `cargo test` (which builds the shims and the sim driver as
//! dependencies of the tests) only in `target/<profile>/deps/`. Where both exist, the
//! newer one is the current build.

use std::path::{Path, PathBuf};

/// `name` in the Cargo profile folder `profile_dir` (`target/debug`, `target/release`):
/// the newer of `profile_dir/name` and `profile_dir/deps/name`, `None` if neither is a
/// file.
pub fn in_profile_dir(profile_dir: &Path, name: &str) -> Option<PathBuf> {
    let modified = |path: &Path| {
        std::fs::metadata(path)
            .ok()
            .filter(|meta| meta.is_file())
            .map(|meta| meta.modified().ok())
    };
    [profile_dir.join(name), profile_dir.join("deps").join(name)]
        .into_iter()
        .filter_map(|path| modified(&path).map(|time| (time, path)))
        .max_by_key(|(time, _)| *time)
        .map(|(_, path)| path)
}

/// `target/<profile>` of the running test executable (`target/<profile>/deps/NAME-HASH`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("a test executable lives in target/<profile>/deps")
        .to_path_buf()
}

/// The repository's root folder (the workspace this crate is part of), for tests that read
/// its files (manifests, docs, scripts, symbol lists).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("test-support lives one folder below the repository root")
        .to_path_buf()
}

/// A library or program this build made, found from the running test: the newer of
/// `target/<profile>/NAME` and `target/<profile>/deps/NAME`; `None` if neither exists.
pub fn built(name: &str) -> Option<PathBuf> {
    in_profile_dir(&profile_dir(), name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn touch(path: &Path, age_s: u64) {
        std::fs::write(path, b"x").unwrap();
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - Duration::from_secs(age_s))
            .unwrap();
    }

    #[test]
    fn the_newer_build_wins_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("deps")).unwrap();
        assert_eq!(in_profile_dir(dir.path(), "libx.so"), None);
        touch(&dir.path().join("deps/libx.so"), 100);
        assert_eq!(
            in_profile_dir(dir.path(), "libx.so"),
            Some(dir.path().join("deps/libx.so"))
        );
        touch(&dir.path().join("libx.so"), 10);
        assert_eq!(
            in_profile_dir(dir.path(), "libx.so"),
            Some(dir.path().join("libx.so"))
        );
        touch(&dir.path().join("deps/libx.so"), 1);
        assert_eq!(
            in_profile_dir(dir.path(), "libx.so"),
            Some(dir.path().join("deps/libx.so"))
        );
        std::fs::create_dir(dir.path().join("libdir.so")).unwrap();
        assert_eq!(in_profile_dir(dir.path(), "libdir.so"), None);
    }
}

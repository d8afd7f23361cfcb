//! Paths of another machine's file system seen through a folder: the host root mounted
//! at `/host` in the init container, or the GPU Operator's driver root
//! `/run/nvidia/driver`.
//!
//! What the loader cache, `ld.so.conf` and the driver packages hold are paths of that
//! file system (`/usr/lib/x86_64-linux-gnu/libcuda.so.1`), and its links may be
//! absolute (Debian's alternatives: `/usr/bin/nvidia-smi -> /etc/alternatives/...`).
//! [`Root::resolve`] follows them the way that machine's own loader would, as
//! `chroot` (or `openat2`'s `RESOLVE_IN_ROOT`) does: an absolute target starts again at
//! the root and `..` never climbs above it, so nothing outside the folder is read. With
//! the root `/` it is plain symlink resolution.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

/// Links followed in one resolution before giving up (the kernel's limit is 40).
const MAX_LINKS: usize = 40;

/// A machine's file system, seen through the folder `dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    dir: PathBuf,
}

/// A regular file found inside a [`Root`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Its path on that machine, every link resolved (`/usr/lib/.../libcuda.so.535.261.03`).
    pub inner: PathBuf,
    /// The same file as this process opens it (`/host/usr/lib/...`).
    pub outer: PathBuf,
}

impl Root {
    /// The file system whose `/` is the folder `dir` (`/` for this machine's own).
    pub fn new(dir: impl Into<PathBuf>) -> Root {
        Root { dir: dir.into() }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// True for this machine's own root.
    pub fn is_own(&self) -> bool {
        self.dir == Path::new("/")
    }

    /// The path this process opens for `inner`, a path of that machine, without
    /// resolving links (`/usr/lib64` in `/host` is `/host/usr/lib64`).
    pub fn outer(&self, inner: &Path) -> PathBuf {
        let mut outer = self.dir.clone();
        for component in inner.components() {
            match component {
                Component::Normal(name) => outer.push(name),
                Component::ParentDir => {
                    if outer != self.dir {
                        outer.pop();
                    }
                }
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            }
        }
        outer
    }

    /// The sub-root at `inner` (the GPU Operator's `/run/nvidia/driver` inside the host).
    pub fn join(&self, inner: &Path) -> Root {
        Root::new(self.outer(inner))
    }

    /// Resolves every link in `inner` inside the root; the target must be a regular file.
    pub fn resolve_file(&self, inner: &Path) -> Result<Resolved, String> {
        let resolved = self.resolve(inner)?;
        let outer = self.outer(&resolved);
        let meta = std::fs::metadata(&outer).map_err(|error| format!("cannot stat: {error}"))?;
        if !meta.is_file() {
            return Err(format!("{} is not a regular file", resolved.display()));
        }
        Ok(Resolved {
            inner: resolved,
            outer,
        })
    }

    /// Resolves every link in `inner` (a path of that machine; a relative one counts
    /// from its `/`) and returns the machine's path of what it names. The last
    /// component need not exist.
    pub fn resolve(&self, inner: &Path) -> Result<PathBuf, String> {
        let mut pending: VecDeque<OsString> = normal_components(inner);
        let mut resolved = PathBuf::from("/");
        let mut links = 0;
        while let Some(name) = pending.pop_front() {
            if name == ".." {
                resolved.pop();
                continue;
            }
            let candidate = resolved.join(&name);
            let outer = self.outer(&candidate);
            match std::fs::symlink_metadata(&outer) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    links += 1;
                    if links > MAX_LINKS {
                        return Err(format!(
                            "more than {MAX_LINKS} links resolving {}",
                            inner.display()
                        ));
                    }
                    let target = std::fs::read_link(&outer).map_err(|error| {
                        format!("cannot read link {}: {error}", candidate.display())
                    })?;
                    if target.is_absolute() {
                        resolved = PathBuf::from("/");
                    }
                    for (at, component) in normal_components(&target).into_iter().enumerate() {
                        pending.insert(at, component);
                    }
                }
                Ok(_) => resolved = candidate,
                Err(error)
                    if error.kind() == std::io::ErrorKind::NotFound && pending.is_empty() =>
                {
                    resolved = candidate;
                }
                Err(error) => {
                    return Err(format!("cannot resolve {}: {error}", candidate.display()));
                }
            }
        }
        Ok(resolved)
    }
}

/// The names and `..` of a path, in order (`/`, `.` and prefixes dropped).
fn normal_components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|component| match component {
            Component::Normal(name) => Some(name.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A small machine: Debian-style alternatives (absolute links), a relative link,
    /// a link that tries to climb out, a loop.
    fn machine() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let at = |inner: &str| dir.path().join(inner.trim_start_matches('/'));
        for folder in [
            "usr/lib/nvidia/current",
            "usr/bin",
            "etc/alternatives",
            "lib",
        ] {
            std::fs::create_dir_all(at(folder)).unwrap();
        }
        std::fs::write(at("usr/lib/nvidia/current/nvidia-smi"), "smi").unwrap();
        symlink(
            "/usr/lib/nvidia/current/nvidia-smi",
            at("etc/alternatives/nvidia--nvidia-smi"),
        )
        .unwrap();
        symlink(
            "/etc/alternatives/nvidia--nvidia-smi",
            at("usr/bin/nvidia-smi"),
        )
        .unwrap();
        symlink("../usr/bin/nvidia-smi", at("lib/smi-relative")).unwrap();
        symlink("../usr/lib/nvidia/current/nvidia-smi", at("lib/smi-direct")).unwrap();
        symlink("../../../../../../etc/passwd", at("lib/escape")).unwrap();
        symlink("loop-b", at("lib/loop-a")).unwrap();
        symlink("loop-a", at("lib/loop-b")).unwrap();
        dir
    }

    #[test]
    fn absolute_links_resolve_inside_the_root() {
        let dir = machine();
        let root = Root::new(dir.path());
        let found = root.resolve_file(Path::new("/usr/bin/nvidia-smi")).unwrap();
        assert_eq!(found.inner, Path::new("/usr/lib/nvidia/current/nvidia-smi"));
        assert_eq!(
            found.outer,
            dir.path().join("usr/lib/nvidia/current/nvidia-smi")
        );
        let relative = root.resolve_file(Path::new("/lib/smi-relative")).unwrap();
        assert_eq!(relative.inner, found.inner);
        // Relative inner paths count from the root too.
        assert_eq!(
            root.resolve(Path::new("usr/bin/nvidia-smi")).unwrap(),
            found.inner
        );
    }

    #[test]
    fn nothing_outside_the_root_is_reached() {
        let dir = machine();
        let root = Root::new(dir.path());
        // `..` stops at the root: the link names the root's own /etc/passwd, absent here.
        assert_eq!(
            root.resolve(Path::new("/lib/escape")).unwrap(),
            Path::new("/etc/passwd")
        );
        assert!(root.resolve_file(Path::new("/lib/escape")).is_err());
        assert_eq!(
            root.outer(Path::new("/../../etc/shadow")),
            dir.path().join("etc/shadow")
        );
        let error = root.resolve(Path::new("/lib/loop-a")).unwrap_err();
        assert!(error.contains("more than 40 links"), "{error}");
        assert!(
            root.resolve_file(Path::new("/usr/lib"))
                .unwrap_err()
                .contains("not a regular file")
        );
    }

    #[test]
    fn own_root_is_plain_resolution_and_sub_roots_nest() {
        let dir = machine();
        let own = Root::new("/");
        assert!(own.is_own());
        let inner = dir.path().join("lib/smi-direct");
        assert_eq!(
            own.resolve_file(&inner).unwrap().outer,
            std::fs::canonicalize(&inner).unwrap()
        );
        let sub = Root::new(dir.path()).join(Path::new("/usr/lib"));
        assert_eq!(sub.dir(), dir.path().join("usr/lib"));
        assert_eq!(
            sub.resolve_file(Path::new("/nvidia/current/nvidia-smi"))
                .unwrap()
                .inner,
            Path::new("/nvidia/current/nvidia-smi")
        );
    }
}

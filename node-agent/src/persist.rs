//! The files the host daemons keep across restarts (the device plugin's
//! `plugin-state.json`, the DRA driver's `dra-state.json`): versioned JSON, read with a
//! version check, written atomically (a temp file beside it, fsync, rename, fsync of
//! the folder), so a crash leaves the old file or the new one, never half of one.

use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A file layout with a version field, read and written as pretty JSON.
pub trait Versioned: Serialize + DeserializeOwned + Default {
    /// The layout this build reads and writes.
    const VERSION: u32;
    /// What the file is, in error messages ("state", "checkpoint").
    const WHAT: &'static str;

    /// The version the file says it has.
    fn version(&self) -> u32;

    /// Reads `path`: a missing file is `Self::default()`, a corrupt one or one of another
    /// version an error (a daemon refuses to start rather than forget what it recorded).
    fn load(path: &Path) -> anyhow::Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(err) => anyhow::bail!("cannot read {}: {err}", path.display()),
        };
        let value: Self = serde_json::from_str(&text)
            .map_err(|err| anyhow::anyhow!("{} is corrupt: {err}", path.display()))?;
        if value.version() != Self::VERSION {
            anyhow::bail!(
                "{}: {} version {} (this build reads {})",
                path.display(),
                Self::WHAT,
                value.version(),
                Self::VERSION
            );
        }
        Ok(value)
    }

    /// Writes the file atomically.
    fn save(&self, path: &Path) -> anyhow::Result<()> {
        write_atomically(path, &serde_json::to_vec_pretty(self)?)
    }
}

/// Creates each of `folders` with its parents; the error names the one that failed.
pub fn create_folders<P: AsRef<Path>>(folders: impl IntoIterator<Item = P>) -> anyhow::Result<()> {
    for folder in folders {
        let folder = folder.as_ref();
        std::fs::create_dir_all(folder)
            .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", folder.display()))?;
    }
    Ok(())
}

/// Replaces `path` with `bytes`: temp file, fsync, rename, fsync of the folder.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{} has no parent folder", path.display()))?;
    std::fs::create_dir_all(dir)
        .map_err(|err| anyhow::anyhow!("cannot create {}: {err}", dir.display()))?;
    let name = path
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("state");
    let temp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| -> std::io::Result<()> {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if let Err(err) = result {
        let _ = std::fs::remove_file(&temp);
        anyhow::bail!("cannot write {}: {err}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Book {
        version: u32,
        entries: Vec<String>,
    }

    impl Versioned for Book {
        const VERSION: u32 = 3;
        const WHAT: &'static str = "book";
        fn version(&self) -> u32 {
            self.version
        }
    }

    #[test]
    fn missing_is_default_corrupt_and_other_versions_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("book.json");
        assert_eq!(Book::load(&path).expect("missing"), Book::default());
        let book = Book {
            version: 3,
            entries: vec!["a".into()],
        };
        book.save(&path).expect("save");
        assert_eq!(Book::load(&path).expect("load"), book);
        let files: Vec<_> = std::fs::read_dir(dir.path()).expect("dir").collect();
        assert_eq!(files.len(), 1, "no temp file is left behind");
        std::fs::write(&path, b"{").expect("write");
        let corrupt = Book::load(&path).unwrap_err().to_string();
        assert!(corrupt.contains("is corrupt"), "{corrupt}");
        std::fs::write(&path, br#"{"version": 2, "entries": []}"#).expect("write");
        let refused = Book::load(&path).unwrap_err().to_string();
        assert!(
            refused.ends_with("book version 2 (this build reads 3)"),
            "{refused}"
        );
    }
}

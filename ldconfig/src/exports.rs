//! What an ELF shared object exports: its defined dynamic symbols (the set
//! `nm -D --defined-only` lists: functions, objects, TLS and absolute symbols, every
//! entry of `.dynsym` whose section is not `SHN_UNDEF`) and its `DT_SONAME`. Also the
//! reader for the `symbols/*.txt` export lists, one name per line.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use object::read::elf::{Dyn, ElfFile, FileHeader, Sym};
use object::{Endianness, FileKind, ReadCache, ReadRef, elf};

/// Why the exports of a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file is not an ELF object, or its tables are damaged.
    #[error("{path} is not a readable ELF shared object: {reason}")]
    NotElf {
        /// The file.
        path: PathBuf,
        /// What the ELF reader said.
        reason: String,
    },
    /// A symbol list line is not a plain symbol name.
    #[error("{path}:{line}: not a symbol name: {text:?}")]
    BadListLine {
        /// The list file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
    },
}

/// The defined dynamic symbols of `lib`, sorted and without duplicates or version
/// suffixes.
pub fn defined_functions(lib: &Path) -> Result<BTreeSet<String>, ExportError> {
    let data = read(lib)?;
    match elf_kind(lib, data.as_slice())? {
        FileKind::Elf64 => defined_in::<elf::FileHeader64<Endianness>>(&data),
        _ => defined_in::<elf::FileHeader32<Endianness>>(&data),
    }
    .map_err(|reason| not_elf(lib, reason))
}

/// The `DT_SONAME` of `lib`, or `None` when it has none. Reads only the headers and
/// tables it needs (a driver library is tens of megabytes; its SONAME a few bytes).
pub fn soname(lib: &Path) -> Result<Option<String>, ExportError> {
    let file = std::fs::File::open(lib).map_err(|source| ExportError::Io {
        path: lib.to_path_buf(),
        source,
    })?;
    let data = ReadCache::new(file);
    match elf_kind(lib, &data)? {
        FileKind::Elf64 => soname_in::<elf::FileHeader64<Endianness>, _>(&data),
        _ => soname_in::<elf::FileHeader32<Endianness>, _>(&data),
    }
    .map_err(|reason| not_elf(lib, reason))
}

fn defined_in<Elf: FileHeader<Endian = Endianness>>(
    data: &[u8],
) -> Result<BTreeSet<String>, String> {
    let file = ElfFile::<Elf>::parse(data).map_err(|error| error.to_string())?;
    let endian = file.endian();
    let table = file.elf_dynamic_symbol_table();
    let strings = table.strings();
    let mut names = BTreeSet::new();
    // Index 0 of every ELF symbol table is the reserved null symbol.
    for symbol in table.symbols().iter().skip(1) {
        if symbol.st_shndx(endian) == elf::SHN_UNDEF {
            continue;
        }
        if matches!(symbol.st_type(), elf::STT_SECTION | elf::STT_FILE) {
            continue;
        }
        let name = symbol
            .name(endian, strings)
            .map_err(|error| error.to_string())?;
        if !name.is_empty() {
            names.insert(String::from_utf8_lossy(name).into_owned());
        }
    }
    Ok(names)
}

fn soname_in<'data, Elf: FileHeader<Endian = Endianness>, R: ReadRef<'data>>(
    data: R,
) -> Result<Option<String>, String> {
    let file = ElfFile::<Elf, R>::parse(data).map_err(|error| error.to_string())?;
    let endian = file.endian();
    let dynamic = file
        .elf_dynamic_table()
        .map_err(|error| error.to_string())?;
    for entry in dynamic.dynamics() {
        let tag = entry.d_tag(endian);
        if tag == elf::DT_NULL {
            break;
        }
        if tag == elf::DT_SONAME {
            let value: u64 = entry.d_val(endian).into();
            let offset =
                u32::try_from(value).map_err(|_| "DT_SONAME offset out of range".to_string())?;
            let name = dynamic
                .strings()
                .get(offset)
                .map_err(|()| "bad DT_SONAME string".to_string())?;
            return Ok(Some(String::from_utf8_lossy(name).into_owned()));
        }
    }
    Ok(None)
}

fn elf_kind<'data, R: ReadRef<'data>>(lib: &Path, data: R) -> Result<FileKind, ExportError> {
    match FileKind::parse(data) {
        Ok(kind @ (FileKind::Elf64 | FileKind::Elf32)) => Ok(kind),
        Ok(other) => Err(not_elf(lib, format!("file kind is {other:?}, not ELF"))),
        Err(error) => Err(not_elf(lib, error.to_string())),
    }
}

fn not_elf(lib: &Path, reason: String) -> ExportError {
    ExportError::NotElf {
        path: lib.to_path_buf(),
        reason,
    }
}

/// Reads a `symbols/*.txt` list: one name per line; blank lines and `#` comments are
/// skipped.
pub fn read_symbol_list(path: &Path) -> Result<BTreeSet<String>, ExportError> {
    let text = std::fs::read_to_string(path).map_err(|source| ExportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut names = BTreeSet::new();
    for (index, line) in text.lines().enumerate() {
        let name = line.trim();
        if name.is_empty() || name.starts_with('#') {
            continue;
        }
        if name.chars().any(char::is_whitespace) {
            return Err(ExportError::BadListLine {
                path: path.to_path_buf(),
                line: index + 1,
                text: line.to_string(),
            });
        }
        names.insert(name.to_string());
    }
    Ok(names)
}

fn read(lib: &Path) -> Result<Vec<u8>, ExportError> {
    std::fs::read(lib).map_err(|source| ExportError::Io {
        path: lib.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Compiles `source` into a shared object with `cc` and returns its path.
    fn build_so(dir: &Path, source: &str, soname: Option<&str>) -> PathBuf {
        let c_file = dir.join("lib.c");
        std::fs::write(&c_file, source).unwrap();
        let out = dir.join("libtest.so");
        let mut command = Command::new("cc");
        command
            .args(["-shared", "-fPIC", "-o"])
            .arg(&out)
            .arg(&c_file);
        if let Some(soname) = soname {
            command.arg(format!("-Wl,-soname,{soname}"));
        }
        let status = command
            .status()
            .expect("cc must be installed for these tests");
        assert!(status.success());
        out
    }

    #[test]
    fn lists_defined_functions_and_objects_not_undefined() {
        let dir = tempfile::tempdir().unwrap();
        let lib = build_so(
            dir.path(),
            "#include <stdio.h>\nint exported_counter = 3;\nint cuFake(void) { return puts(\"x\"); }\nint cuOther(int a) { return a; }\nstatic int hidden(void) { return 1; }\nint use_hidden(void) { return hidden(); }\n",
            Some("libtest.so.1"),
        );
        let names = defined_functions(&lib).unwrap();
        for expected in ["cuFake", "cuOther", "exported_counter", "use_hidden"] {
            assert!(
                names.contains(expected),
                "{expected} missing from {names:?}"
            );
        }
        assert!(!names.contains("puts"), "undefined import listed");
        assert!(!names.contains("hidden"), "static function listed");
        // Same set as nm -D --defined-only.
        let nm = Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(&lib)
            .output()
            .unwrap();
        let from_nm: BTreeSet<String> = String::from_utf8(nm.stdout)
            .unwrap()
            .lines()
            .filter_map(|line| line.split_whitespace().last().map(str::to_string))
            .collect();
        assert_eq!(names, from_nm);
        assert_eq!(soname(&lib).unwrap().as_deref(), Some("libtest.so.1"));
    }

    /// A versioned system library: the set equals nm's with the `@@VERSION` suffixes
    /// dropped, version-definition (`ABS`) symbols included.
    #[test]
    fn versioned_system_library_matches_nm() {
        let lib = Path::new("/lib/x86_64-linux-gnu/libz.so.1");
        assert!(lib.exists(), "zlib1g is part of every Debian system");
        let nm = Command::new("nm")
            .args(["-D", "--defined-only"])
            .arg(lib)
            .output()
            .unwrap();
        let from_nm: BTreeSet<String> = String::from_utf8(nm.stdout)
            .unwrap()
            .lines()
            .filter_map(|line| line.split_whitespace().last())
            .map(|name| name.split('@').next().unwrap_or(name).to_string())
            .collect();
        let ours = defined_functions(lib).unwrap();
        assert!(ours.contains("deflate") && ours.contains("ZLIB_1.2.0"));
        assert_eq!(ours, from_nm);
        assert_eq!(soname(lib).unwrap().as_deref(), Some("libz.so.1"));
    }

    #[test]
    fn missing_soname_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let lib = build_so(dir.path(), "int f(void) { return 0; }\n", None);
        assert_eq!(soname(&lib).unwrap(), None);
    }

    #[test]
    fn non_elf_and_missing_files_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("text.so");
        std::fs::write(&text, "not an elf").unwrap();
        let error = defined_functions(&text).unwrap_err();
        assert!(matches!(error, ExportError::NotElf { .. }), "{error}");
        assert!(error.to_string().contains("text.so"));
        let error = soname(&dir.path().join("absent.so")).unwrap_err();
        assert!(matches!(error, ExportError::Io { .. }), "{error}");
        // A truncated real ELF must fail cleanly too.
        let lib = build_so(dir.path(), "int f(void) { return 0; }\n", Some("libt.so.1"));
        let bytes = std::fs::read(&lib).unwrap();
        let cut = dir.path().join("cut.so");
        for len in [20, 64, 200, bytes.len() / 2] {
            std::fs::write(&cut, &bytes[..len]).unwrap();
            let _ = defined_functions(&cut);
            let _ = soname(&cut);
        }
        std::fs::write(&cut, &bytes[..20]).unwrap();
        assert!(defined_functions(&cut).is_err());
    }

    #[test]
    fn symbol_list_reader_skips_comments_and_rejects_junk() {
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("l.txt");
        std::fs::write(&list, "# header\ncuInit\n\ncuDriverGetVersion\ncuInit\n").unwrap();
        let names = read_symbol_list(&list).unwrap();
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            ["cuDriverGetVersion", "cuInit"]
        );
        std::fs::write(&list, "cuInit\n0000 T cuFoo\n").unwrap();
        let error = read_symbol_list(&list).unwrap_err();
        assert!(error.to_string().contains(":2:"), "{error}");
    }
}

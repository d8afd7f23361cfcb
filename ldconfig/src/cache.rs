//! Reader for glibc's `/etc/ld.so.cache`, the table the dynamic loader consults to map
//! a SONAME such as `libcuda.so.1` to a file.
//!
//! Two on-disk formats exist and both are read here:
//!
//! * the old libc5 format, magic `ld.so-1.7.0`: a 16-byte header (`magic[11]`, padding,
//!   `u32 nlibs`), `nlibs` 12-byte entries (`i32 flags, u32 key, u32 value`) and a string
//!   table whose offsets count from the end of the entry array. glibc 2.2 to 2.31 hid a
//!   new-format cache inside that string table, right after the entries, aligned to 8;
//! * the new format, magic `glibc-ld.so.cache1.1`: a 48-byte header (`nlibs`,
//!   `len_strings`, an endianness flag byte, `extension_offset`), `nlibs` 24-byte entries
//!   (`i32 flags, u32 key, u32 value, u32 osversion, u64 hwcap`) and strings whose offsets
//!   count from the start of the new-format header. An optional extension directory
//!   (magic `0xEAA42174`) names the `glibc-hwcaps` subdirectories that entries with
//!   hwcap bit 62 refer to.
//!
//! When a file carries both, the new-format entries win, as they do in the loader.
//! Every offset is bounds-checked: a truncated or corrupt cache is a [`CacheError`].

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Magic of the old (libc5 / glibc 2.0) format.
const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
/// Magic plus version of the new format.
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// Old header: 11 magic bytes, 1 padding byte, `u32 nlibs`.
const OLD_HEADER_LEN: usize = 16;
const OLD_ENTRY_LEN: usize = 12;
/// New header: 20 magic bytes, nlibs, len_strings, flags byte + 3 padding,
/// extension_offset, 3 unused words.
const NEW_HEADER_LEN: usize = 48;
const NEW_ENTRY_LEN: usize = 24;
/// Alignment of the new-format header when it follows the old one.
const NEW_HEADER_ALIGN: usize = 8;
/// Magic at the start of the extension directory.
const EXTENSION_MAGIC: u32 = 0xEAA4_2174;
/// Extension section tag listing the glibc-hwcaps subdirectory names.
const EXTENSION_TAG_GLIBC_HWCAPS: u32 = 1;
/// hwcap bit marking an entry that lives in a glibc-hwcaps subdirectory; the low 32
/// bits are then an index into the subdirectory name list.
const HWCAP_EXTENSION_BIT: u64 = 1 << 62;
/// Endianness values of the new header's flag byte (low two bits).
const ENDIAN_UNSET: u8 = 0;
const ENDIAN_LITTLE: u8 = 2;
const ENDIAN_BIG: u8 = 3;

/// Entry flag bits: the low byte is the library type, the next byte the ABI.
pub const FLAG_TYPE_MASK: u32 = 0x00ff;
/// `FLAG_ELF_LIBC6`: an ELF library linked against glibc.
pub const FLAG_ELF_LIBC6: u32 = 0x0003;
/// ABI byte of an x86-64 (LP64) library.
pub const FLAG_X8664_LIB64: u32 = 0x0300;
/// Mask selecting the ABI byte.
pub const FLAG_ABI_MASK: u32 = 0xff00;

/// Why a cache could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The file could not be read at all.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The cache file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// Neither magic was found at the start of the file.
    #[error("not an ld.so.cache: unknown magic at offset 0")]
    BadMagic,
    /// A header, entry table or string ran past the end of the data.
    #[error("truncated ld.so.cache: {what} needs bytes {start}..{end} but the file has {len}")]
    Truncated {
        /// The structure being read.
        what: &'static str,
        /// First byte needed.
        start: usize,
        /// One past the last byte needed.
        end: usize,
        /// Bytes available.
        len: usize,
    },
    /// A string offset points outside the string table or has no terminating NUL.
    #[error("corrupt ld.so.cache: entry {index} has a bad {field} string offset {offset}")]
    BadString {
        /// Entry index.
        index: usize,
        /// `key` or `value`.
        field: &'static str,
        /// The offending offset.
        offset: u32,
    },
    /// A string is not UTF-8 (names and paths are expected to be).
    #[error("corrupt ld.so.cache: entry {index} {field} is not UTF-8")]
    NotUtf8 {
        /// Entry index.
        index: usize,
        /// `key` or `value`.
        field: &'static str,
    },
    /// The new format's endianness flag says big-endian or is invalid.
    #[error("unsupported ld.so.cache byte order flag {0} (only little-endian caches are read)")]
    ByteOrder(u8),
}

/// The ABI an entry was recorded for, from the flags' second byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheArch {
    /// No ABI byte: a 32-bit (i386) library on x86 hosts.
    Default,
    /// `FLAG_X8664_LIB64`.
    X86_64,
    /// `FLAG_X8664_LIBX32`.
    X32,
    /// `FLAG_AARCH64_LIB64`.
    Aarch64,
    /// Any other ABI byte, kept verbatim.
    Other(u8),
}

impl CacheArch {
    fn from_flags(flags: u32) -> Self {
        match (flags & FLAG_ABI_MASK) >> 8 {
            0x00 => CacheArch::Default,
            0x03 => CacheArch::X86_64,
            0x08 => CacheArch::X32,
            0x0a => CacheArch::Aarch64,
            other => CacheArch::Other(other as u8),
        }
    }
}

impl fmt::Display for CacheArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CacheArch::Default => Ok(()),
            CacheArch::X86_64 => f.write_str(",x86-64"),
            CacheArch::X32 => f.write_str(",x32"),
            CacheArch::Aarch64 => f.write_str(",AArch64"),
            CacheArch::Other(byte) => write!(f, ",abi-{byte:#04x}"),
        }
    }
}

/// One library the cache knows about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CacheEntry {
    /// The lookup key, a SONAME such as `libcuda.so.1`.
    pub name: String,
    /// Where the loader opens it (usually a symlink to the versioned file).
    pub path: PathBuf,
    /// The raw entry flags (`FLAG_ELF_LIBC6 | FLAG_X8664_LIB64` = `0x0303` for a
    /// normal x86-64 library).
    pub flags: u32,
    /// True when the ABI byte says x86-64 (what a 64-bit process on this host loads).
    pub is_x86_64: bool,
    /// The ABI from the flags.
    pub arch: CacheArch,
    /// The raw hwcap word (0 in the old format).
    pub hwcap: u64,
    /// The glibc-hwcaps subdirectory (`x86-64-v3`, ...) for entries that carry the
    /// hwcap extension bit, when the extension directory names it.
    pub hwcaps_subdir: Option<String>,
}

impl CacheEntry {
    /// True for entries of a `glibc-hwcaps` subdirectory (hwcap bit 62), which only
    /// loaders that match the subdirectory's CPU level use.
    pub fn is_hwcaps_subdir(&self) -> bool {
        self.hwcap & HWCAP_EXTENSION_BIT != 0
    }
}

/// Reads and parses a cache file, e.g. `/etc/ld.so.cache`.
pub fn read_cache(path: &Path) -> Result<Vec<CacheEntry>, CacheError> {
    let bytes = std::fs::read(path).map_err(|source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_cache(&bytes)
}

/// Parses cache bytes of either format; entries come back in file order.
pub fn parse_cache(bytes: &[u8]) -> Result<Vec<CacheEntry>, CacheError> {
    if bytes.starts_with(NEW_MAGIC) {
        return parse_new(bytes, 0);
    }
    if bytes.starts_with(OLD_MAGIC) {
        let nlibs = read_u32(bytes, 12, "old header")? as usize;
        let entries_end = entries_end(
            OLD_HEADER_LEN,
            nlibs,
            OLD_ENTRY_LEN,
            bytes.len(),
            "old entry table",
        )?;
        let new_start = entries_end.div_ceil(NEW_HEADER_ALIGN) * NEW_HEADER_ALIGN;
        if bytes.len() >= new_start && bytes[new_start..].starts_with(NEW_MAGIC) {
            return parse_new(bytes, new_start);
        }
        return parse_old(bytes, nlibs, entries_end);
    }
    Err(CacheError::BadMagic)
}

fn parse_old(
    bytes: &[u8],
    nlibs: usize,
    strings_start: usize,
) -> Result<Vec<CacheEntry>, CacheError> {
    let strings = &bytes[strings_start..];
    (0..nlibs)
        .map(|index| {
            let at = OLD_HEADER_LEN + index * OLD_ENTRY_LEN;
            let flags = read_u32(bytes, at, "old entry")?;
            let key = read_u32(bytes, at + 4, "old entry")?;
            let value = read_u32(bytes, at + 8, "old entry")?;
            Ok(CacheEntry {
                name: string_at(strings, key, index, "key")?,
                path: PathBuf::from(string_at(strings, value, index, "value")?),
                flags,
                is_x86_64: CacheArch::from_flags(flags) == CacheArch::X86_64,
                arch: CacheArch::from_flags(flags),
                hwcap: 0,
                hwcaps_subdir: None,
            })
        })
        .collect()
}

/// Parses a new-format cache whose header starts at `base`; string offsets count from
/// `base`.
fn parse_new(bytes: &[u8], base: usize) -> Result<Vec<CacheEntry>, CacheError> {
    let header_end = base + NEW_HEADER_LEN;
    if bytes.len() < header_end {
        return Err(CacheError::Truncated {
            what: "new header",
            start: base,
            end: header_end,
            len: bytes.len(),
        });
    }
    let nlibs = read_u32(bytes, base + 20, "new header")? as usize;
    let endian = bytes[base + 28] & 0x3;
    if endian != ENDIAN_UNSET && endian != ENDIAN_LITTLE {
        return Err(CacheError::ByteOrder(if endian == ENDIAN_BIG {
            ENDIAN_BIG
        } else {
            endian
        }));
    }
    let extension_offset = read_u32(bytes, base + 32, "new header")? as usize;
    entries_end(
        header_end,
        nlibs,
        NEW_ENTRY_LEN,
        bytes.len(),
        "new entry table",
    )?;
    let strings = &bytes[base..];
    let hwcaps_subdirs = if extension_offset != 0 {
        read_hwcaps_subdirs(strings, extension_offset)
    } else {
        Vec::new()
    };
    (0..nlibs)
        .map(|index| {
            let at = header_end + index * NEW_ENTRY_LEN;
            let flags = read_u32(bytes, at, "new entry")?;
            let key = read_u32(bytes, at + 4, "new entry")?;
            let value = read_u32(bytes, at + 8, "new entry")?;
            let hwcap = read_u64(bytes, at + 16, "new entry")?;
            let hwcaps_subdir = if hwcap & HWCAP_EXTENSION_BIT != 0 {
                hwcaps_subdirs.get((hwcap & 0xffff_ffff) as usize).cloned()
            } else {
                None
            };
            let arch = CacheArch::from_flags(flags);
            Ok(CacheEntry {
                name: string_at(strings, key, index, "key")?,
                path: PathBuf::from(string_at(strings, value, index, "value")?),
                flags,
                is_x86_64: arch == CacheArch::X86_64,
                arch,
                hwcap,
                hwcaps_subdir,
            })
        })
        .collect()
}

/// Reads the glibc-hwcaps subdirectory names from the extension directory. The
/// extension data is advisory (the loader ignores what it does not understand), so a
/// damaged directory yields no names rather than an error.
fn read_hwcaps_subdirs(strings: &[u8], extension_offset: usize) -> Vec<String> {
    let read = |at: usize| read_u32(strings, at, "extension").ok();
    if read(extension_offset) != Some(EXTENSION_MAGIC) {
        return Vec::new();
    }
    let Some(count) = read(extension_offset + 4) else {
        return Vec::new();
    };
    // Each section: u32 tag, u32 flags, u32 offset, u32 size.
    for section in 0..count.min(64) as usize {
        let at = extension_offset + 8 + section * 16;
        let (Some(tag), Some(offset), Some(size)) = (read(at), read(at + 8), read(at + 12)) else {
            return Vec::new();
        };
        if tag != EXTENSION_TAG_GLIBC_HWCAPS {
            continue;
        }
        return (0..(size / 4) as usize)
            .map_while(|slot| read(offset as usize + slot * 4))
            .map_while(|name_offset| string_at(strings, name_offset, 0, "hwcaps").ok())
            .collect();
    }
    Vec::new()
}

fn entries_end(
    start: usize,
    count: usize,
    entry_len: usize,
    len: usize,
    what: &'static str,
) -> Result<usize, CacheError> {
    let end = count
        .checked_mul(entry_len)
        .and_then(|size| size.checked_add(start))
        .ok_or(CacheError::Truncated {
            what,
            start,
            end: usize::MAX,
            len,
        })?;
    if end > len {
        return Err(CacheError::Truncated {
            what,
            start,
            end,
            len,
        });
    }
    Ok(end)
}

fn read_u32(bytes: &[u8], at: usize, what: &'static str) -> Result<u32, CacheError> {
    let end = at.saturating_add(4);
    match bytes.get(at..end) {
        Some(&[a, b, c, d]) => Ok(u32::from_le_bytes([a, b, c, d])),
        _ => Err(CacheError::Truncated {
            what,
            start: at,
            end,
            len: bytes.len(),
        }),
    }
}

fn read_u64(bytes: &[u8], at: usize, what: &'static str) -> Result<u64, CacheError> {
    let low = read_u32(bytes, at, what)? as u64;
    let high = read_u32(bytes, at + 4, what)? as u64;
    Ok(low | (high << 32))
}

fn string_at(
    strings: &[u8],
    offset: u32,
    index: usize,
    field: &'static str,
) -> Result<String, CacheError> {
    let bad = CacheError::BadString {
        index,
        field,
        offset,
    };
    let tail = strings.get(offset as usize..).ok_or(bad)?;
    let nul = tail
        .iter()
        .position(|&byte| byte == 0)
        .ok_or(CacheError::BadString {
            index,
            field,
            offset,
        })?;
    std::str::from_utf8(&tail[..nul])
        .map(str::to_owned)
        .map_err(|_| CacheError::NotUtf8 { index, field })
}

/// Formats an entry the way `ldconfig -p` does: `\tNAME (libc6,x86-64) => PATH`.
pub fn ldconfig_p_line(entry: &CacheEntry) -> String {
    let kind = match entry.flags & FLAG_TYPE_MASK {
        0x0000 => "libc4",
        0x0001 => "ELF",
        0x0002 => "libc5",
        0x0003 => "libc6",
        _ => "unknown",
    };
    let hwcaps = match &entry.hwcaps_subdir {
        Some(subdir) => format!(", hwcap: \"{subdir}\""),
        None => String::new(),
    };
    format!(
        "\t{} ({kind}{}{hwcaps}) => {}",
        entry.name,
        entry.arch,
        entry.path.display()
    )
}

/// Builders for synthetic caches, used by this crate's tests and by other crates'
/// tests that need a loader view pointing at a fixture folder.
pub mod build {
    use super::*;

    /// Builds a new-format (`glibc-ld.so.cache1.1`) cache. `entries` are
    /// `(name, path, flags)`.
    pub fn new_format(entries: &[(&str, &str, u32)]) -> Vec<u8> {
        new_format_at(entries, 0)
    }

    /// Builds a cache in the old `ld.so-1.7.0` format only.
    pub fn old_format(entries: &[(&str, &str, u32)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let mut out = Vec::new();
        out.extend_from_slice(OLD_MAGIC);
        out.push(0);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for (name, path, flags) in entries {
            let key = push_string(&mut strings, name);
            let value = push_string(&mut strings, path);
            out.extend_from_slice(&flags.to_le_bytes());
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&value.to_le_bytes());
        }
        out.extend_from_slice(&strings);
        out
    }

    /// Builds the glibc 2.2-2.31 compat layout: an old-format table whose string table
    /// starts with an embedded new-format cache. The old entries' offsets are shifted
    /// so both views name the same strings.
    pub fn compat_format(entries: &[(&str, &str, u32)]) -> Vec<u8> {
        let old_entries_end = OLD_HEADER_LEN + entries.len() * OLD_ENTRY_LEN;
        let new_start = old_entries_end.div_ceil(NEW_HEADER_ALIGN) * NEW_HEADER_ALIGN;
        let new_part = new_format_at(entries, 0);
        let new_strings_start = NEW_HEADER_LEN + entries.len() * NEW_ENTRY_LEN;
        let shift = (new_start - old_entries_end) as u32;
        let mut out = Vec::new();
        out.extend_from_slice(OLD_MAGIC);
        out.push(0);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for index in 0..entries.len() {
            let new_entry = NEW_HEADER_LEN + index * NEW_ENTRY_LEN;
            out.extend_from_slice(&new_part[new_entry..new_entry + 4]);
            for word in [4, 8] {
                let at = new_entry + word;
                let offset = u32::from_le_bytes([
                    new_part[at],
                    new_part[at + 1],
                    new_part[at + 2],
                    new_part[at + 3],
                ]);
                out.extend_from_slice(&(offset + shift).to_le_bytes());
            }
        }
        out.resize(new_start, 0);
        debug_assert!(new_strings_start <= new_part.len());
        out.extend_from_slice(&new_part);
        out
    }

    pub(crate) fn new_format_at(entries: &[(&str, &str, u32)], hwcap: u64) -> Vec<u8> {
        let strings_start = NEW_HEADER_LEN + entries.len() * NEW_ENTRY_LEN;
        let mut strings = Vec::new();
        let mut table = Vec::new();
        for (name, path, flags) in entries {
            let key = strings_start as u32 + push_string(&mut strings, name);
            let value = strings_start as u32 + push_string(&mut strings, path);
            table.extend_from_slice(&flags.to_le_bytes());
            table.extend_from_slice(&key.to_le_bytes());
            table.extend_from_slice(&value.to_le_bytes());
            table.extend_from_slice(&0u32.to_le_bytes());
            table.extend_from_slice(&hwcap.to_le_bytes());
        }
        let mut out = Vec::new();
        out.extend_from_slice(NEW_MAGIC);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        out.extend_from_slice(&[ENDIAN_LITTLE, 0, 0, 0]);
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&[0; 12]);
        out.extend_from_slice(&table);
        out.extend_from_slice(&strings);
        out
    }

    fn push_string(strings: &mut Vec<u8>, text: &str) -> u32 {
        let offset = strings.len() as u32;
        strings.extend_from_slice(text.as_bytes());
        strings.push(0);
        offset
    }

    /// Flags of an ordinary x86-64 glibc library.
    pub const X86_64_LIBC6: u32 = FLAG_ELF_LIBC6 | FLAG_X8664_LIB64;
    /// Flags of a 32-bit glibc library.
    pub const I386_LIBC6: u32 = FLAG_ELF_LIBC6;
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    fn sample() -> Vec<(&'static str, &'static str, u32)> {
        vec![
            (
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                X86_64_LIBC6,
            ),
            (
                "libcuda.so.1",
                "/usr/lib/i386-linux-gnu/libcuda.so.1",
                I386_LIBC6,
            ),
            (
                "libnvidia-ml.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
                X86_64_LIBC6,
            ),
        ]
    }

    fn check_sample(entries: &[CacheEntry]) {
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].name, "libcuda.so.1");
        assert_eq!(
            entries[0].path,
            Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        );
        assert!(entries[0].is_x86_64);
        assert_eq!(entries[0].flags, 0x0303);
        assert_eq!(
            entries[1].path,
            Path::new("/usr/lib/i386-linux-gnu/libcuda.so.1")
        );
        assert!(!entries[1].is_x86_64);
        assert_eq!(entries[1].arch, CacheArch::Default);
        assert_eq!(entries[2].name, "libnvidia-ml.so.1");
    }

    #[test]
    fn parses_hand_built_new_format() {
        check_sample(&parse_cache(&new_format(&sample())).unwrap());
    }

    #[test]
    fn parses_hand_built_old_format() {
        check_sample(&parse_cache(&old_format(&sample())).unwrap());
    }

    #[test]
    fn parses_compat_format_through_embedded_new_table() {
        let bytes = compat_format(&sample());
        assert!(bytes.starts_with(OLD_MAGIC));
        check_sample(&parse_cache(&bytes).unwrap());
        // The old view on its own (what a libc5 loader sees) names the same strings.
        let nlibs = 3;
        let old = parse_old(&bytes, nlibs, OLD_HEADER_LEN + nlibs * OLD_ENTRY_LEN).unwrap();
        check_sample(&old);
    }

    #[test]
    fn empty_caches_parse_to_nothing() {
        assert!(parse_cache(&new_format(&[])).unwrap().is_empty());
        assert!(parse_cache(&old_format(&[])).unwrap().is_empty());
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        for bytes in [
            new_format(&sample()),
            old_format(&sample()),
            compat_format(&sample()),
        ] {
            // Cutting inside the strings (keeping whole tables) must fail too: the last
            // string loses its NUL.
            for cut in 0..bytes.len() {
                let result = parse_cache(&bytes[..cut]);
                assert!(result.is_err(), "prefix of {cut} bytes parsed: {result:?}");
            }
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let base = new_format(&sample());
        for round in 0..4000 {
            let mut bytes = if round % 2 == 0 {
                base.clone()
            } else {
                old_format(&sample())
            };
            for _ in 0..(1 + next() % 8) {
                let at = (next() as usize) % bytes.len();
                bytes[at] = next() as u8;
            }
            let _ = parse_cache(&bytes);
        }
        let _ = parse_cache(b"");
        let random: Vec<u8> = (0..512).map(|_| next() as u8).collect();
        assert!(matches!(parse_cache(&random), Err(CacheError::BadMagic)));
    }

    #[test]
    fn huge_nlibs_is_truncated_error() {
        let mut bytes = new_format(&sample());
        bytes[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            parse_cache(&bytes),
            Err(CacheError::Truncated { .. })
        ));
        let mut bytes = old_format(&sample());
        bytes[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            parse_cache(&bytes),
            Err(CacheError::Truncated { .. })
        ));
    }

    #[test]
    fn bad_string_offset_is_reported() {
        let mut bytes = new_format(&sample());
        bytes[NEW_HEADER_LEN + 4..NEW_HEADER_LEN + 8]
            .copy_from_slice(&0xffff_fff0u32.to_le_bytes());
        let error = parse_cache(&bytes).unwrap_err();
        assert!(
            matches!(
                error,
                CacheError::BadString {
                    index: 0,
                    field: "key",
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn big_endian_flag_is_refused() {
        let mut bytes = new_format(&sample());
        bytes[28] = ENDIAN_BIG;
        assert!(matches!(parse_cache(&bytes), Err(CacheError::ByteOrder(3))));
    }

    #[test]
    fn hwcaps_extension_names_subdirectory() {
        let entries = [(
            "libfoo.so.1",
            "/usr/lib/glibc-hwcaps/x86-64-v3/libfoo.so.1",
            X86_64_LIBC6,
        )];
        let mut bytes = new_format_at_for_test(&entries, HWCAP_EXTENSION_BIT);
        // Append: the subdirectory name, its offset array, then the extension directory.
        let name_offset = bytes.len() as u32;
        bytes.extend_from_slice(b"x86-64-v3\0");
        while !bytes.len().is_multiple_of(4) {
            bytes.push(0);
        }
        let array_offset = bytes.len() as u32;
        bytes.extend_from_slice(&name_offset.to_le_bytes());
        let extension_offset = bytes.len() as u32;
        for word in [
            EXTENSION_MAGIC,
            1,
            EXTENSION_TAG_GLIBC_HWCAPS,
            0,
            array_offset,
            4,
        ] {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        bytes[32..36].copy_from_slice(&extension_offset.to_le_bytes());
        let parsed = parse_cache(&bytes).unwrap();
        assert_eq!(parsed[0].hwcaps_subdir.as_deref(), Some("x86-64-v3"));
        assert!(parsed[0].is_hwcaps_subdir());
        assert!(ldconfig_p_line(&parsed[0]).contains("hwcap: \"x86-64-v3\""));
    }

    fn new_format_at_for_test(entries: &[(&str, &str, u32)], hwcap: u64) -> Vec<u8> {
        super::build::new_format_at(entries, hwcap)
    }

    /// Compares the parse of this machine's cache with `ldconfig -p`.
    #[test]
    fn matches_ldconfig_p_on_this_machine() {
        let cache = Path::new("/etc/ld.so.cache");
        let Ok(output) = std::process::Command::new("ldconfig")
            .args(["-p", "-C"])
            .arg(cache)
            .output()
        else {
            panic!("ldconfig is not runnable here; install libc-bin");
        };
        assert!(output.status.success(), "ldconfig -p failed");
        let text = String::from_utf8(output.stdout).unwrap();
        let expected: Vec<&str> = text.lines().filter(|line| line.starts_with('\t')).collect();
        let entries = read_cache(cache).unwrap();
        let ours: Vec<String> = entries.iter().map(ldconfig_p_line).collect();
        assert!(!ours.is_empty());
        assert_eq!(ours, expected);
        let count_line = text.lines().next().unwrap();
        assert!(
            count_line.starts_with(&format!("{} libs found", entries.len())),
            "{count_line}"
        );
    }
}

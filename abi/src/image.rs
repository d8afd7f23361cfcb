//! Module images as `cuModuleLoadData*`, `cuModuleLoadFatBinary` and `cuLibraryLoad*`
//! take them (PTX text, an ELF cubin, a fatbin, or the `__fatBinC_Wrapper_t` that
//! `fatbinary_section.h` declares around one), and the device memory their static data
//! takes once loaded: what `__device__` variables the image declares, which the driver
//! allocates for the module, not at any allocation call.
//!
//! - PTX: the `.global` declarations outside functions (element size × count);
//! - cubin: the sizes of its `.nv.global` (zero-filled) and `.nv.global.init`
//!   (initialised) sections;
//! - fatbin: the largest of its uncompressed entries (the driver loads one of them);
//!   compressed entries are not read (the caller settles those after the load).
//!
//! Every function reads only the bytes it is given and never panics; sizes saturate.

/// `0xBA55ED50`: the first word of a fatbin.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// `FATBINC_MAGIC` of `fatbinary_section.h`: the first word of `__fatBinC_Wrapper_t`.
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// The most bytes of an image this module reads (a header claiming more is not read).
pub const MAX_IMAGE_BYTES: u64 = 1 << 30;

/// Fatbin entry kinds.
const ENTRY_PTX: u16 = 1;
const ENTRY_ELF: u16 = 2;
/// The entry flag of a compressed payload.
const ENTRY_COMPRESSED: u64 = 0x2000;
/// ELF section types: `.nv.global` is NOBITS, `.nv.global.init` PROGBITS.
const ELF_HEADER_BYTES: usize = 64;

/// What an image's first bytes say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    /// An ELF cubin.
    Elf,
    /// A fatbin container.
    Fatbin,
    /// A `__fatBinC_Wrapper_t` (its `data` pointer names the fatbin).
    FatbinWrapper,
    /// Anything else: PTX text (NUL-terminated).
    Ptx,
}

/// The kind of the image starting with `head` (at least 4 bytes).
pub fn kind(head: &[u8]) -> ImageKind {
    match head {
        [0x7f, b'E', b'L', b'F', ..] => ImageKind::Elf,
        [a, b, c, d, ..] => match u32::from_le_bytes([*a, *b, *c, *d]) {
            FATBIN_MAGIC => ImageKind::Fatbin,
            FATBIN_WRAPPER_MAGIC => ImageKind::FatbinWrapper,
            _ => ImageKind::Ptx,
        },
        _ => ImageKind::Ptx,
    }
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        bytes.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// The bytes of an ELF64 image to read for its section table: up to the end of the
/// table (from the 64-byte header); `None` for a header that is not ELF64 or claims more
/// than [`MAX_IMAGE_BYTES`].
pub fn elf_table_end(header: &[u8]) -> Option<usize> {
    if header.len() < ELF_HEADER_BYTES || header.get(4) != Some(&2) {
        return None;
    }
    let shoff = u64_at(header, 0x28)?;
    let entry = u64::from(u16_at(header, 0x3a)?);
    let count = u64::from(u16_at(header, 0x3c)?);
    let end = shoff.checked_add(entry.checked_mul(count)?)?;
    (end <= MAX_IMAGE_BYTES && entry >= 0x40).then_some(end as usize)
}

/// The section-name string table's end, past which [`elf_static_bytes`] also reads.
pub fn elf_names_end(image: &[u8]) -> Option<usize> {
    let (_, _, offset, size) = elf_section(image, usize::from(u16_at(image, 0x3e)?))?;
    let end = offset.checked_add(size)?;
    (end <= MAX_IMAGE_BYTES).then_some(end as usize)
}

/// Section `index`: (name offset, type, file offset, size).
fn elf_section(image: &[u8], index: usize) -> Option<(u32, u32, u64, u64)> {
    let shoff = usize::try_from(u64_at(image, 0x28)?).ok()?;
    let entry = usize::from(u16_at(image, 0x3a)?);
    let at = shoff.checked_add(index.checked_mul(entry)?)?;
    Some((
        u32_at(image, at)?,
        u32_at(image, at + 4)?,
        u64_at(image, at + 0x18)?,
        u64_at(image, at + 0x20)?,
    ))
}

/// Bytes of static data an ELF cubin declares: the sizes of its `.nv.global` and
/// `.nv.global.init` sections. `None` when the section table cannot be read from
/// `image` (which must reach [`elf_table_end`] and [`elf_names_end`]).
pub fn elf_static_bytes(image: &[u8]) -> Option<u64> {
    let count = usize::from(u16_at(image, 0x3c)?);
    let (_, _, names_at, names_size) = elf_section(image, usize::from(u16_at(image, 0x3e)?))?;
    let names_at = usize::try_from(names_at).ok()?;
    let names = image.get(names_at..names_at.checked_add(usize::try_from(names_size).ok()?)?)?;
    let mut total = 0u64;
    for index in 0..count {
        let (name_at, _, _, size) = elf_section(image, index)?;
        let name = names.get(name_at as usize..).unwrap_or(&[]);
        let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
        if name == b".nv.global" || name == b".nv.global.init" {
            total = total.saturating_add(size);
        }
    }
    Some(total)
}

/// The bytes of a fatbin to read (header and entries), from its 16-byte header; `None`
/// past [`MAX_IMAGE_BYTES`].
pub fn fatbin_len(header: &[u8]) -> Option<usize> {
    if kind(header) != ImageKind::Fatbin {
        return None;
    }
    let header_size = u64::from(u16_at(header, 6)?);
    let len = header_size.checked_add(u64_at(header, 8)?)?;
    (len <= MAX_IMAGE_BYTES).then_some(len as usize)
}

/// Bytes of static data a fatbin's loaded entry declares: the largest over its
/// uncompressed ELF and PTX entries (the driver picks one for the card). `None` when no
/// entry could be read (all compressed, or the container is damaged).
pub fn fatbin_static_bytes(image: &[u8]) -> Option<u64> {
    let end = fatbin_len(image)?.min(image.len());
    let mut at = usize::from(u16_at(image, 6)?);
    let mut largest: Option<u64> = None;
    while at
        .checked_add(64)
        .is_some_and(|header_end| header_end <= end)
    {
        let kind = u16_at(image, at)?;
        let header_size = u32_at(image, at + 4)? as usize;
        let size = usize::try_from(u64_at(image, at + 8)?).ok()?;
        let flags = u64_at(image, at + 40)?;
        let payload_at = at.checked_add(header_size)?;
        let payload = image.get(payload_at..payload_at.checked_add(size)?)?;
        if flags & ENTRY_COMPRESSED == 0 {
            let found = match kind {
                ENTRY_ELF => elf_static_bytes(payload),
                ENTRY_PTX => Some(ptx_static_bytes(payload)),
                _ => None,
            };
            if let Some(bytes) = found {
                largest = Some(largest.unwrap_or(0).max(bytes));
            }
        }
        at = payload_at.checked_add(size)?;
        if header_size == 0 && size == 0 {
            break;
        }
    }
    largest
}

/// The size in bytes of a PTX scalar type (`.b8` … `.f64`, `.b128`).
fn ptx_type_bytes(token: &str) -> Option<u64> {
    Some(match token {
        ".b8" | ".u8" | ".s8" | ".pred" => 1,
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => 2,
        ".b32" | ".u32" | ".s32" | ".f32" | ".f16x2" | ".bf16x2" => 4,
        ".b64" | ".u64" | ".s64" | ".f64" => 8,
        ".b128" => 16,
        _ => return None,
    })
}

/// Bytes of static data a PTX text declares: every `.global` variable outside a
/// function (not `.extern`, not a parameter's state space), element size × vector
/// width × array extents, each aligned. Text past a NUL is not read.
pub fn ptx_static_bytes(text: &[u8]) -> u64 {
    let text = &text[..text.iter().position(|b| *b == 0).unwrap_or(text.len())];
    let mut total = 0u64;
    // Function bodies, and braces of an initializer (`= {1, 2}`), which are not bodies.
    let (mut depth, mut initializer) = (0usize, 0usize);
    let mut start = 0usize;
    let mut at = 0usize;
    while at < text.len() {
        let byte = text[at];
        if text[at..].starts_with(b"//") {
            at += text[at..]
                .iter()
                .position(|b| *b == b'\n')
                .unwrap_or(text.len() - at);
            continue;
        }
        match byte {
            b'{' if depth == 0 && text[start..at].contains(&b'=') => initializer += 1,
            b'{' => depth += 1,
            b'}' if initializer > 0 => initializer -= 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    start = at + 1;
                }
            }
            b';' if depth == 0 && initializer == 0 => {
                total = total.saturating_add(declaration_bytes(&text[start..at]));
                start = at + 1;
            }
            _ => {}
        }
        at += 1;
    }
    total
}

/// The tokens of a PTX statement with their offsets; `//` comments are skipped.
fn tokens(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut at = 0usize;
    core::iter::from_fn(move || {
        let bytes = text.as_bytes();
        loop {
            while at < bytes.len() && bytes[at].is_ascii_whitespace() {
                at += 1;
            }
            if text[at..].starts_with("//") {
                at += text[at..].find('\n').unwrap_or(text.len() - at);
                continue;
            }
            break;
        }
        if at >= bytes.len() {
            return None;
        }
        let begin = at;
        while at < bytes.len() && !bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        Some((begin, &text[begin..at]))
    })
}

/// The bytes one top-level PTX statement declares in `.global` (0 for anything else).
fn declaration_bytes(statement: &[u8]) -> u64 {
    let Ok(text) = core::str::from_utf8(statement) else {
        return 0;
    };
    let mut seen_global = false;
    let mut align = 1u64;
    let mut vector = 1u64;
    let mut found: Option<(u64, usize)> = None;
    let mut expect_align = false;
    for (offset, token) in tokens(text) {
        if expect_align {
            align = token.parse().unwrap_or(1).max(1);
            expect_align = false;
            continue;
        }
        match token {
            ".extern" | ".param" | ".ptr" | ".func" | ".entry" => return 0,
            ".global" => seen_global = true,
            ".align" => expect_align = true,
            ".v2" => vector = 2,
            ".v4" => vector = 4,
            ".v8" => vector = 8,
            _ => {
                if let Some(bytes) = ptx_type_bytes(token) {
                    found = Some((bytes, offset + token.len()));
                    break;
                }
            }
        }
    }
    let (true, Some((element, rest_at))) = (seen_global, found) else {
        return 0;
    };
    let rest = &text[rest_at..];
    let each = element.saturating_mul(vector);
    let mut total = 0u64;
    let mut braces = 0usize;
    let mut declarator_start = 0usize;
    let bytes = rest.as_bytes();
    for at in 0..=bytes.len() {
        match bytes.get(at).copied().unwrap_or(b',') {
            b'{' => braces += 1,
            b'}' => braces = braces.saturating_sub(1),
            b',' if braces == 0 => {
                let declarator = &rest[declarator_start..at];
                let declarator = declarator.split('=').next().unwrap_or("");
                let size = each.saturating_mul(extent(declarator));
                total = total.saturating_add(size.div_ceil(align).saturating_mul(align));
                declarator_start = at + 1;
            }
            _ => {}
        }
    }
    total
}

/// The element count of a declarator `name[a][b]` (1 without brackets, 0 for an
/// unsized `[]`).
fn extent(declarator: &str) -> u64 {
    let mut count = 1u64;
    let mut rest = declarator;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find(']') else {
            return 0;
        };
        let inside = rest[open + 1..open + close].trim();
        count = count.saturating_mul(inside.parse::<u64>().unwrap_or(0));
        rest = &rest[open + close + 1..];
    }
    if declarator.trim().is_empty() {
        0
    } else {
        count
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    const MIB: u64 = 1 << 20;

    #[test]
    fn ptx_global_declarations_count_and_nothing_else_does() {
        let ptx = b"
.version 8.0
.target sm_90
.address_size 64
// .global .b8 commented[999999];
.global .align 4 .b8 data[1610612736];
.visible .global .align 8 .u64 counter;
.global .align 16 .v4 .f32 vectors[10], pair[2][3];
.global .u32 table[4] = {1, 2, 3, 4}, tail;
.extern .global .b8 elsewhere[4096];
.const .align 4 .b8 constant[65536];
.shared .align 4 .b8 tile[4096];
.visible .entry k(.param .u64 .ptr .global .align 1 p)
{
    .local .align 4 .b8 frame[64];
    ld.global.u32 %r1, [p];
    ret;
}
\0.global .b8 after_the_nul[123456789];";
        let expected = 1_610_612_736 + 8 + 16 * 10 + 16 * 6 + 4 * 4 + 4;
        assert_eq!(ptx_static_bytes(ptx), expected);
        assert_eq!(ptx_static_bytes(b""), 0);
        assert_eq!(
            ptx_static_bytes(b".global .b8 huge[18446744073709551615][4];"),
            u64::MAX,
            "saturates"
        );
        assert_eq!(ptx_static_bytes(b".global .b8 open[;"), 0, "unsized");
    }

    /// An ELF64 with a section table of `sections` (name, type, size) and their names.
    pub(crate) fn elf(sections: &[(&str, u32, u64)]) -> Vec<u8> {
        let mut names = std::vec![0u8];
        let mut offsets = Vec::new();
        for (name, _, _) in sections {
            offsets.push(names.len() as u32);
            names.extend_from_slice(name.as_bytes());
            names.push(0);
        }
        offsets.push(names.len() as u32);
        names.extend_from_slice(b".shstrtab\0");
        let names_at = 64u64;
        let table_at = (64 + names.len() as u64).div_ceil(8) * 8;
        let count = sections.len() as u16 + 2;
        let mut image = std::vec![0u8; table_at as usize];
        image[..4].copy_from_slice(b"\x7fELF");
        image[4] = 2;
        image[0x28..0x30].copy_from_slice(&table_at.to_le_bytes());
        image[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        image[0x3c..0x3e].copy_from_slice(&count.to_le_bytes());
        image[0x3e..0x40].copy_from_slice(&(count - 1).to_le_bytes());
        image[64..64 + names.len()].copy_from_slice(&names);
        image.extend_from_slice(&[0u8; 64]);
        let mut header = |name: u32, kind: u32, offset: u64, size: u64| {
            let mut entry = [0u8; 64];
            entry[..4].copy_from_slice(&name.to_le_bytes());
            entry[4..8].copy_from_slice(&kind.to_le_bytes());
            entry[0x18..0x20].copy_from_slice(&offset.to_le_bytes());
            entry[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            image.extend_from_slice(&entry);
        };
        for (index, (_, kind, size)) in sections.iter().enumerate() {
            header(offsets[index], *kind, 0, *size);
        }
        header(offsets[sections.len()], 3, names_at, names.len() as u64);
        image
    }

    #[test]
    fn cubin_global_sections_count_and_others_do_not() {
        let image = elf(&[
            (".text.kernel", 1, 4096),
            (".nv.global", 8, 1536 * MIB),
            (".nv.global.init", 1, 3 * MIB),
            (".nv.constant0.kernel", 1, 64 << 10),
            (".nv.shared.kernel", 8, 48 << 10),
        ]);
        assert_eq!(elf_table_end(&image[..64]), Some(image.len()));
        assert!(elf_names_end(&image).is_some_and(|end| end <= image.len()));
        assert_eq!(elf_static_bytes(&image), Some(1539 * MIB));
        assert_eq!(kind(&image), ImageKind::Elf);
        assert_eq!(elf_static_bytes(&image[..100]), None, "a cut image");
        let mut huge = image.clone();
        huge[0x28..0x30].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
        assert_eq!(elf_table_end(&huge[..64]), None);
        assert_eq!(elf_static_bytes(&huge), None);
    }

    fn fatbin(entries: &[(u16, u64, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for (kind, flags, payload) in entries {
            let mut header = [0u8; 64];
            header[..2].copy_from_slice(&kind.to_le_bytes());
            header[4..8].copy_from_slice(&64u32.to_le_bytes());
            header[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            header[40..48].copy_from_slice(&flags.to_le_bytes());
            body.extend_from_slice(&header);
            body.extend_from_slice(payload);
        }
        let mut image = Vec::new();
        image.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        image.extend_from_slice(&1u16.to_le_bytes());
        image.extend_from_slice(&16u16.to_le_bytes());
        image.extend_from_slice(&(body.len() as u64).to_le_bytes());
        image.extend_from_slice(&body);
        image
    }

    #[test]
    fn a_fatbin_counts_its_largest_readable_entry() {
        let cubin = elf(&[(".nv.global", 8, 100 * MIB)]);
        let ptx = b".global .b8 d[314572800];\0";
        let image = fatbin(&[(ENTRY_ELF, 0, &cubin), (ENTRY_PTX, 0, ptx)]);
        assert_eq!(kind(&image), ImageKind::Fatbin);
        assert_eq!(fatbin_len(&image[..16]), Some(image.len()));
        assert_eq!(fatbin_static_bytes(&image), Some(300 * MIB));
        let compressed = fatbin(&[(ENTRY_ELF, ENTRY_COMPRESSED, &cubin)]);
        assert_eq!(fatbin_static_bytes(&compressed), None, "nothing readable");
        assert_eq!(fatbin_static_bytes(&image[..40]), None, "a cut container");
        assert_eq!(
            kind(&FATBIN_WRAPPER_MAGIC.to_le_bytes()),
            ImageKind::FatbinWrapper
        );
        assert_eq!(kind(b".ver"), ImageKind::Ptx);
        assert_eq!(kind(b""), ImageKind::Ptx);
    }
}

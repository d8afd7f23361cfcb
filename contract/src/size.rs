//! Byte sizes as written in configs and on command lines, with Kubernetes
//! `resource.Quantity` semantics: a plain number of bytes, or a number with a suffix.
//!
//! | suffix | meaning |
//! | --- | --- |
//! | none, `B` | bytes |
//! | `Ki` `Mi` `Gi` `Ti` `Pi` `Ei` (and `KiB` … `EiB`) | powers of 1024 |
//! | `k` `M` `G` `T` `P` `E` (and `kB`/`KB` `MB` `GB` `TB` `PB` `EB`) | powers of 1000 |
//!
//! | `m` `u` `n` | milli, micro, nano: powers of 1/1000 (`3000m` is 3) |
//!
//! A decimal fraction (`1.5Gi`) and a decimal exponent (`129e6`, `1E3`) are accepted as
//! Kubernetes accepts them. The value must come to a whole number, as Kubernetes demands
//! of extended resources: `1.5` bytes, `100m` and `12e-1` are errors, never rounded (so
//! `512m`, Docker's way of writing 512 MiB, is refused rather than read as one byte).
//! `K` (Kubernetes has no such suffix: `k` is 1000, `Ki` 1024), negative values and
//! anything that does not fit in 64 bits are errors, never a silent wrap.
//!
//! This is the workspace's one quantity parser: configs, command lines and the sim read
//! sizes with it, and `vgpu-kube` reads the API server's quantities (claims' consumed
//! capacity) with [`parse_whole`].

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// Why a size string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Nothing to parse.
    #[error("empty size")]
    Empty,
    /// Not a number with an optional unit.
    #[error("`{0}` is not a size: expected bytes or a number with a unit such as 7680Mi or 30Gi")]
    Malformed(String),
    /// Below zero.
    #[error("`{0}` is negative")]
    Negative(String),
    /// A unit that is none of Kubernetes' nor the usual byte units.
    #[error(
        "unknown unit `{unit}` in `{text}` (use Ki Mi Gi Ti Pi Ei for powers of 1024, k M G T P E for powers of 1000, or KiB MiB GiB TiB, kB MB GB TB)"
    )]
    UnknownUnit {
        /// The whole size.
        text: String,
        /// The unit it names.
        unit: String,
    },
    /// `K`, which Kubernetes does not have.
    #[error("`{0}`: `K` is no Kubernetes unit; write `k` (1000) or `Ki` (1024)")]
    UpperK(String),
    /// More than `u64::MAX`.
    #[error("`{0}` does not fit in 64 bits")]
    Overflow(String),
    /// A fraction of a byte (or of a core): `1.5`, `100m` (`m` is milli, 10^-3).
    #[error("`{0}` is not a whole number (`m` is milli, 10^-3: for megabytes write M or Mi)")]
    NotWhole(String),
}

const KI: u128 = 1 << 10;

/// Every accepted suffix: its multiplier and the power of ten it scales by.
const UNITS: &[(&str, u128, i32)] = &[
    ("", 1, 0),
    ("B", 1, 0),
    ("n", 1, -9),
    ("u", 1, -6),
    ("m", 1, -3),
    ("Ki", KI, 0),
    ("Mi", KI.pow(2), 0),
    ("Gi", KI.pow(3), 0),
    ("Ti", KI.pow(4), 0),
    ("Pi", KI.pow(5), 0),
    ("Ei", KI.pow(6), 0),
    ("KiB", KI, 0),
    ("MiB", KI.pow(2), 0),
    ("GiB", KI.pow(3), 0),
    ("TiB", KI.pow(4), 0),
    ("PiB", KI.pow(5), 0),
    ("EiB", KI.pow(6), 0),
    ("k", 1, 3),
    ("M", 1, 6),
    ("G", 1, 9),
    ("T", 1, 12),
    ("P", 1, 15),
    ("E", 1, 18),
    ("kB", 1, 3),
    ("KB", 1, 3),
    ("MB", 1, 6),
    ("GB", 1, 9),
    ("TB", 1, 12),
    ("PB", 1, 15),
    ("EB", 1, 18),
];

impl ByteSize {
    /// The number of bytes.
    pub const fn bytes(self) -> u64 {
        self.0
    }

    /// `n` MiB.
    pub const fn mib(n: u64) -> ByteSize {
        ByteSize(n << 20)
    }

    /// `n` GiB.
    pub const fn gib(n: u64) -> ByteSize {
        ByteSize(n << 30)
    }
}

/// The number part of a size: its digits as one integer and the power of ten they are
/// scaled by (`1.5e3` is 15 × 10^2).
struct Decimal {
    digits: u128,
    exponent: i32,
    /// False when a nonzero digit past the twenty kept ones was dropped.
    exact: bool,
}

/// Splits `text` (already trimmed, no sign) into its number and its suffix.
fn split_number(text: &str) -> Option<(Decimal, &str)> {
    let bytes = text.as_bytes();
    let mut at = 0;
    let mut digits: u128 = 0;
    let mut exponent: i32 = 0;
    let mut seen_digit = false;
    let mut in_fraction = false;
    // Twenty significant digits are kept (more than 64 bits need); a nonzero digit past
    // them makes the number inexact (too large, or not whole).
    const KEPT: u128 = 10u128.pow(20);
    let mut dropped = false;
    while at < bytes.len() {
        match bytes[at] {
            b'0'..=b'9' => {
                seen_digit = true;
                let digit = (bytes[at] - b'0') as u128;
                if digits < KEPT {
                    digits = digits * 10 + digit;
                    if in_fraction {
                        exponent -= 1;
                    }
                } else {
                    dropped |= digit != 0;
                    if !in_fraction {
                        exponent = exponent.checked_add(1)?;
                    }
                }
            }
            b'.' if !in_fraction => in_fraction = true,
            _ => break,
        }
        at += 1;
    }
    if !seen_digit {
        return None;
    }
    // A decimal exponent: `e`/`E` followed by an optionally signed integer (a bare `E`
    // is the exa suffix).
    let rest = &text[at..];
    if let Some(after) = rest.strip_prefix(['e', 'E']) {
        let unsigned = after.strip_prefix(['+', '-']).unwrap_or(after);
        let len = unsigned.bytes().take_while(u8::is_ascii_digit).count();
        if len > 0 {
            let sign_len = after.len() - unsigned.len();
            let value: i32 = unsigned[..len].parse().ok().filter(|v| *v <= 1000)?;
            let value = if after.starts_with('-') {
                -value
            } else {
                value
            };
            exponent = exponent.checked_add(value)?;
            return Some((
                Decimal {
                    digits,
                    exponent,
                    exact: !dropped,
                },
                &after[sign_len + len..],
            ));
        }
    }
    Some((
        Decimal {
            digits,
            exponent,
            exact: !dropped,
        },
        rest,
    ))
}

/// The whole number a size or Kubernetes quantity stands for, exactly (see the module's
/// table of suffixes): `2560Mi`, `3000m`, `1e3`, `2.5Gi`.
pub fn parse_whole(text: &str) -> Result<u64, SizeError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(SizeError::Empty);
    }
    let unsigned = match trimmed.strip_prefix('-') {
        Some(rest)
            if rest
                .trim_start()
                .starts_with(|c: char| c.is_ascii_digit() || c == '.') =>
        {
            return Err(SizeError::Negative(text.to_string()));
        }
        Some(_) => return Err(SizeError::Malformed(text.to_string())),
        None => trimmed.strip_prefix('+').unwrap_or(trimmed),
    };
    let (number, unit) =
        split_number(unsigned).ok_or_else(|| SizeError::Malformed(text.to_string()))?;
    let unit = unit.trim();
    let (multiplier, unit_exponent) = match UNITS.iter().find(|(name, _, _)| *name == unit) {
        Some((_, multiplier, exponent)) => (*multiplier, *exponent),
        None if unit == "K" => return Err(SizeError::UpperK(text.to_string())),
        None if unit.starts_with(|c: char| c.is_ascii_digit() || c == '.') => {
            return Err(SizeError::Malformed(text.to_string()));
        }
        None => {
            return Err(SizeError::UnknownUnit {
                text: text.to_string(),
                unit: unit.to_string(),
            });
        }
    };
    let overflow = || SizeError::Overflow(text.to_string());
    let not_whole = || SizeError::NotWhole(text.to_string());
    let exponent = number
        .exponent
        .checked_add(unit_exponent)
        .ok_or_else(overflow)?;
    if number.digits == 0 {
        // Zero, whatever its unit; a dropped nonzero digit is past 20 zeros: a fraction.
        return if number.exact {
            Ok(0)
        } else {
            Err(not_whole())
        };
    }
    let scaled = number.digits.checked_mul(multiplier).ok_or_else(overflow)?;
    let value = if exponent >= 0 {
        if !number.exact {
            // The dropped digits were whole-number digits: past 10^20.
            return Err(overflow());
        }
        10u128
            .checked_pow(exponent as u32)
            .and_then(|power| scaled.checked_mul(power))
            .ok_or_else(overflow)?
    } else {
        let power = 10u128
            .checked_pow(exponent.unsigned_abs())
            .ok_or_else(not_whole)?;
        if !number.exact || !scaled.is_multiple_of(power) {
            return Err(not_whole());
        }
        scaled / power
    };
    u64::try_from(value).map_err(|_| overflow())
}

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(text: &str) -> Result<ByteSize, SizeError> {
        parse_whole(text).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    /// Prints the largest binary unit that divides the size exactly (`4GiB`, `7680MiB`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        for (unit, shift) in [("TiB", 40u32), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
            if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
                return write!(f, "{}{unit}", bytes >> shift);
            }
        }
        write!(f, "{bytes}")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ByteSize, D::Error> {
        struct SizeVisitor;
        impl Visitor<'_> for SizeVisitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte count or a size such as 7680Mi or 30Gi")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("negative size {v}")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ByteSize, E> {
                Err(E::custom(format!(
                    "size {v} is not a whole number of bytes; add a unit such as Mi"
                )))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(SizeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(text: &str) -> Result<u64, SizeError> {
        text.parse::<ByteSize>().map(ByteSize::bytes)
    }

    #[test]
    fn kubernetes_suffixes() {
        assert_eq!(size("7680MiB"), Ok(7680 << 20));
        assert_eq!(size("7680Mi"), Ok(7680 << 20));
        assert_eq!(size("512M"), Ok(512_000_000), "M is 10^6, as in Kubernetes");
        assert_eq!(size("1k"), Ok(1000));
        assert_eq!(size("1Ki"), Ok(1024));
        assert_eq!(size("1KiB"), Ok(1024));
        assert_eq!(size("2G"), Ok(2_000_000_000));
        assert_eq!(size("2Gi"), Ok(2 << 30));
        assert_eq!(size("30GiB"), Ok(30 << 30));
        assert_eq!(size("1T"), Ok(1_000_000_000_000));
        assert_eq!(size("1Ti"), Ok(1 << 40));
        assert_eq!(size("1Pi"), Ok(1 << 50));
        assert_eq!(size("1P"), Ok(10u64.pow(15)));
        assert_eq!(size("1Ei"), Ok(1 << 60));
        assert_eq!(size("1E"), Ok(10u64.pow(18)), "a bare E is exa");
        assert_eq!(size("2GB"), Ok(2_000_000_000));
        assert_eq!(size("3kB"), Ok(3000));
        assert_eq!(size("1000"), Ok(1000));
        assert_eq!(size("+1000"), Ok(1000));
        assert_eq!(size(" 256 MiB "), Ok(256 << 20));
    }

    #[test]
    fn fractions_and_exponents_as_kubernetes_reads_them() {
        assert_eq!(size("1.5GiB"), Ok(3 << 29));
        assert_eq!(size("1.5Gi"), Ok(3 << 29));
        assert_eq!(size("0.5Ki"), Ok(512));
        assert_eq!(size(".5Ki"), Ok(512));
        assert_eq!(size("129e6"), Ok(129_000_000));
        assert_eq!(size("1E3"), Ok(1000));
        assert_eq!(size("1e+3"), Ok(1000));
        assert_eq!(size("12e-1"), Err(SizeError::NotWhole("12e-1".into())));
        assert_eq!(size("1.0001"), Err(SizeError::NotWhole("1.0001".into())));
        assert_eq!(size("0.1"), Err(SizeError::NotWhole("0.1".into())));
        assert_eq!(size("0"), Ok(0));
        assert_eq!(size("0.000m"), Ok(0));
        assert_eq!(size("0.5e1"), Ok(5));
        assert_eq!(
            size("1.00000000000000000000000000000000000000000001Ki"),
            Err(SizeError::NotWhole(
                "1.00000000000000000000000000000000000000000001Ki".into()
            ))
        );
        assert_eq!(size("1.00000000000000000000000000000000Ki"), Ok(1024));
    }

    /// Issue 26: `vgpu-kube` read `3000m` as 3 and this parser refused every `m`. One
    /// parser now: `m` is milli everywhere, and the value must be whole.
    #[test]
    fn milli_is_milli_and_must_come_to_a_whole_number() {
        assert_eq!(size("3000m"), Ok(3));
        assert_eq!(size("2000000u"), Ok(2), "micro");
        assert_eq!(size("4000000000n"), Ok(4), "nano");
        for text in ["4m", "512m", "100m", "1500m", "1n"] {
            assert_eq!(size(text), Err(SizeError::NotWhole(text.into())), "{text}");
        }
        let message = SizeError::NotWhole("512m".into()).to_string();
        assert!(
            message.contains("milli") && message.contains("Mi"),
            "{message}"
        );
    }

    #[test]
    fn refuses_garbage_and_never_wraps() {
        assert_eq!(size(""), Err(SizeError::Empty));
        assert!(matches!(size("GiB"), Err(SizeError::Malformed(_))));
        assert!(matches!(size("."), Err(SizeError::Malformed(_))));
        assert!(matches!(
            size("4 parsecs"),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(size("1.2.3GiB"), Err(SizeError::Malformed(_))));
        assert!(matches!(size("-4GiB"), Err(SizeError::Negative(_))));
        assert!(matches!(size("4K"), Err(SizeError::UpperK(_))));
        assert!(matches!(size("4mi"), Err(SizeError::UnknownUnit { .. })));
        assert!(matches!(
            size("99999999999TiB"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(size("16Ei"), Err(SizeError::Overflow(_))));
        assert!(matches!(size("1e20"), Err(SizeError::Overflow(_))));
        assert!(matches!(size("1e999999"), Err(SizeError::Malformed(_))));
        assert!(matches!(
            size("309485009821345068724781057.0TiB"),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(
            size("309485009821345068724781057309485009821345068724781057"),
            Err(SizeError::Overflow(_))
        ));
        assert_eq!(size("18446744073709551615"), Ok(u64::MAX));
        assert!(matches!(
            size("18446744073709551616"),
            Err(SizeError::Overflow(_))
        ));
    }

    #[test]
    fn displays_exact_units_that_parse_back() {
        assert_eq!(ByteSize::gib(4).to_string(), "4GiB");
        assert_eq!(ByteSize::mib(7680).to_string(), "7680MiB");
        assert_eq!(ByteSize(1001).to_string(), "1001");
        assert_eq!(ByteSize(0).to_string(), "0");
        for value in [ByteSize::gib(4), ByteSize(1001), ByteSize(3 << 29)] {
            assert_eq!(value.to_string().parse::<ByteSize>(), Ok(value));
        }
    }
}

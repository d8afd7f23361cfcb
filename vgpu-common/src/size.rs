//! Byte sizes as written in configs and on command lines: plain integers (bytes) or a
//! number with a unit (`7680MiB`, `30GiB`, `4Gi`, `512M`, `1.5GiB`).
//!
//! Binary units (`KiB`/`Ki`/`K`, `MiB`/`Mi`/`M`, ...) are powers of 1024; the decimal
//! units `kB`/`KB`, `MB`, `GB`, `TB` are powers of 1000, as in Kubernetes quantities.

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
    #[error("empty size")]
    Empty,
    #[error("`{0}` is not a size: expected bytes or a number with a unit such as 7680MiB or 30GiB")]
    Malformed(String),
    #[error(
        "unknown unit `{unit}` in `{text}` (use B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, kB, MB, GB, TB)"
    )]
    UnknownUnit { text: String, unit: String },
    #[error("`{0}` does not fit in 64 bits of bytes")]
    Overflow(String),
}

const UNITS: &[(&str, u64)] = &[
    ("", 1),
    ("B", 1),
    ("K", 1 << 10),
    ("Ki", 1 << 10),
    ("KiB", 1 << 10),
    ("M", 1 << 20),
    ("Mi", 1 << 20),
    ("MiB", 1 << 20),
    ("G", 1 << 30),
    ("Gi", 1 << 30),
    ("GiB", 1 << 30),
    ("T", 1 << 40),
    ("Ti", 1 << 40),
    ("TiB", 1 << 40),
    ("kB", 1_000),
    ("KB", 1_000),
    ("MB", 1_000_000),
    ("GB", 1_000_000_000),
    ("TB", 1_000_000_000_000),
];

impl ByteSize {
    pub const fn bytes(self) -> u64 {
        self.0
    }

    pub const fn mib(n: u64) -> ByteSize {
        ByteSize(n << 20)
    }

    pub const fn gib(n: u64) -> ByteSize {
        ByteSize(n << 30)
    }
}

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(text: &str) -> Result<ByteSize, SizeError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(SizeError::Empty);
        }
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let unit = unit.trim();
        if number.is_empty() {
            return Err(SizeError::Malformed(text.to_string()));
        }
        let multiplier = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, m)| *m)
            .ok_or_else(|| SizeError::UnknownUnit {
                text: text.to_string(),
                unit: unit.to_string(),
            })?;
        if let Some((whole, frac)) = number.split_once('.') {
            if frac.contains('.') || (whole.is_empty() && frac.is_empty()) {
                return Err(SizeError::Malformed(text.to_string()));
            }
            let whole: u128 = if whole.is_empty() {
                0
            } else {
                whole
                    .parse()
                    .map_err(|_| SizeError::Overflow(text.to_string()))?
            };
            let digits = frac.len().min(18) as u32;
            let frac_value: u128 = if digits == 0 {
                0
            } else {
                frac[..digits as usize]
                    .parse()
                    .map_err(|_| SizeError::Malformed(text.to_string()))?
            };
            let scale = 10u128.pow(digits);
            let total = whole * multiplier as u128 + frac_value * multiplier as u128 / scale;
            u64::try_from(total)
                .map(ByteSize)
                .map_err(|_| SizeError::Overflow(text.to_string()))
        } else {
            let value: u64 = number
                .parse()
                .map_err(|_| SizeError::Overflow(text.to_string()))?;
            value
                .checked_mul(multiplier)
                .map(ByteSize)
                .ok_or_else(|| SizeError::Overflow(text.to_string()))
        }
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
                f.write_str("a byte count or a size such as 7680MiB or 30GiB")
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
                    "size {v} is not a whole number of bytes; add a unit such as MiB"
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

    #[test]
    fn parses_units() {
        assert_eq!("7680MiB".parse::<ByteSize>(), Ok(ByteSize(7680 << 20)));
        assert_eq!("30GiB".parse::<ByteSize>(), Ok(ByteSize(30 << 30)));
        assert_eq!("4Gi".parse::<ByteSize>(), Ok(ByteSize(4 << 30)));
        assert_eq!("1.5GiB".parse::<ByteSize>(), Ok(ByteSize(3 << 29)));
        assert_eq!("1000".parse::<ByteSize>(), Ok(ByteSize(1000)));
        assert_eq!("2GB".parse::<ByteSize>(), Ok(ByteSize(2_000_000_000)));
        assert_eq!(" 256 MiB ".parse::<ByteSize>(), Ok(ByteSize(256 << 20)));
    }

    #[test]
    fn refuses_garbage() {
        assert!(matches!("".parse::<ByteSize>(), Err(SizeError::Empty)));
        assert!(matches!(
            "GiB".parse::<ByteSize>(),
            Err(SizeError::Malformed(_))
        ));
        assert!(matches!(
            "4 parsecs".parse::<ByteSize>(),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            "1.2.3GiB".parse::<ByteSize>(),
            Err(SizeError::Malformed(_))
        ));
        assert!(matches!(
            "99999999999TiB".parse::<ByteSize>(),
            Err(SizeError::Overflow(_))
        ));
        assert!(matches!(
            "-4GiB".parse::<ByteSize>(),
            Err(SizeError::Malformed(_))
        ));
    }

    #[test]
    fn displays_exact_units() {
        assert_eq!(ByteSize::gib(4).to_string(), "4GiB");
        assert_eq!(ByteSize::mib(7680).to_string(), "7680MiB");
        assert_eq!(ByteSize(1001).to_string(), "1001");
        assert_eq!(ByteSize(0).to_string(), "0");
    }
}

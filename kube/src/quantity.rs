//! Resource quantities (`2560Mi`, `60`, `1e3`, `2.5Gi`) read exactly as whole numbers,
//! and byte counts written in their shortest binary form. A quantity that is not a
//! whole number, is negative or does not fit is an error naming the text.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

const BINARY: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];
const DECIMAL: [(&str, i32); 9] = [
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
    ("E", 18),
];

/// The whole number a quantity stands for.
pub fn parse_whole(text: &str) -> Result<u64, String> {
    let bad = |why: &str| format!("quantity `{text}`: {why}");
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    let number = number.strip_prefix('+').unwrap_or(number);
    if number.is_empty() || number.matches('.').count() > 1 || number == "." {
        return Err(bad("not a number"));
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let mantissa: u128 = format!("{whole}{fraction}")
        .parse()
        .map_err(|_| bad("not a number"))?;
    // value = mantissa × 10^(exp10 − fraction digits) × 2^exp2
    let mut exp10 = -(fraction.len() as i32);
    let mut exp2 = 0u32;
    if let Some((_, shift)) = BINARY.iter().find(|(name, _)| *name == suffix) {
        exp2 = *shift;
    } else if let Some((_, power)) = DECIMAL.iter().find(|(name, _)| *name == suffix) {
        exp10 += power;
    } else if let Some(exponent) = suffix.strip_prefix(['e', 'E']) {
        exp10 += exponent.parse::<i32>().map_err(|_| bad("bad exponent"))?;
    } else if !suffix.is_empty() {
        return Err(bad("unknown suffix"));
    }
    let too_big = || bad("too large");
    let mut value = mantissa.checked_mul(1u128 << exp2).ok_or_else(too_big)?;
    if exp10 >= 0 {
        let scale = 10u128.checked_pow(exp10 as u32).ok_or_else(too_big)?;
        value = value.checked_mul(scale).ok_or_else(too_big)?;
    } else {
        let scale = 10u128
            .checked_pow(exp10.unsigned_abs())
            .ok_or_else(|| bad("not a whole number"))?;
        if value % scale != 0 {
            return Err(bad("not a whole number"));
        }
        value /= scale;
    }
    u64::try_from(value).map_err(|_| too_big())
}

/// [`parse_whole`] of a k8s-openapi quantity.
pub fn whole(quantity: &Quantity) -> Result<u64, String> {
    parse_whole(&quantity.0)
}

/// Bytes in the largest binary unit that divides them exactly (`2560Mi`, `80Gi`, `1000`).
pub fn bytes(value: u64) -> Quantity {
    for (name, shift) in BINARY.iter().rev() {
        let unit = 1u64 << shift;
        if value != 0 && value.is_multiple_of(unit) {
            return Quantity(format!("{}{name}", value / unit));
        }
    }
    Quantity(value.to_string())
}

/// A plain count (`100`).
pub fn count(value: u64) -> Quantity {
    Quantity(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_forms_the_api_server_writes() {
        for (text, value) in [
            ("60", 60),
            ("2560Mi", 2560 << 20),
            ("2684354560", 2684354560),
            ("2.5Gi", 2560 << 20),
            ("1e3", 1000),
            ("1k", 1000),
            ("3000m", 3),
            ("+4", 4),
            ("0", 0),
        ] {
            assert_eq!(parse_whole(text), Ok(value), "{text}");
        }
        for text in [
            "",
            "-1",
            "1.5",
            "2x",
            "1.2.3",
            "100m",
            "1e-1",
            "99999999Ei",
            "Mi",
        ] {
            assert!(parse_whole(text).is_err(), "{text} must be refused");
        }
    }

    #[test]
    fn writes_bytes_in_the_largest_exact_unit() {
        assert_eq!(bytes(2560 << 20).0, "2560Mi");
        assert_eq!(bytes(80 << 30).0, "80Gi");
        assert_eq!(bytes(256 << 20).0, "256Mi");
        assert_eq!(bytes(1000).0, "1000");
        assert_eq!(bytes(0).0, "0");
        for value in [2560u64 << 20, 80 << 30, 1000, 12345 << 10] {
            assert_eq!(parse_whole(&bytes(value).0), Ok(value));
        }
    }
}

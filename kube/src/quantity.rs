//! Resource quantities (`2560Mi`, `60`, `1e3`, `2.5Gi`) read exactly as whole numbers,
//! by vgpu-contract's one quantity parser, and byte counts written in their shortest
//! binary form. A quantity that is not a whole number, is negative or does not fit is
//! an error naming the text.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The binary units [`bytes`] writes, largest last.
const BINARY: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];

/// The whole number a quantity stands for, read by the workspace's one quantity parser
/// ([`vgpu_contract::size::parse_whole`]: `m` is milli, and the value must be whole).
pub fn parse_whole(text: &str) -> Result<u64, String> {
    vgpu_contract::size::parse_whole(text).map_err(|why| format!("quantity `{text}`: {why}"))
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

    /// Issue 26: this crate read `3000m` as 3 while vgpu-common (now vgpu-contract) refused every `m`; both
    /// now go through one parser and agree on each of these.
    #[test]
    fn agrees_with_the_config_sizes_on_milli_and_fractions() {
        for text in [
            "3000m", "100m", "4m", "1.5", "2.5Gi", "1e3", "12e-1", "1Ki", "7680MiB",
        ] {
            assert_eq!(
                parse_whole(text).ok(),
                text.parse::<vgpu_contract::ByteSize>()
                    .ok()
                    .map(|size| size.bytes()),
                "{text}"
            );
        }
        assert!(parse_whole("100m").unwrap_err().contains("milli"));
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

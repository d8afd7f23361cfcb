//! The driver version the sim reports (`nvmlSystemGetDriverVersion`, and the tail of
//! `nvmlSystemGetNVMLVersion`). A real driver's libraries carry their version in their
//! file names (`libnvidia-ml.so.535.261.03`), and the driver's own tools check that what
//! NVML reports is theirs (Debian's nvidia-smi 535 refuses anything else: "Mismatch in
//! versions between nvidia-smi and NVML"). So the sim reports, in this order:
//! `VGPU_SIM_DRIVER_VERSION`; the version in the name of the file it was loaded from,
//! links resolved (installed in a real driver's place, it is that driver's version);
//! else [`DRIVER_VERSION`].

use std::ffi::{CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::config::DRIVER_VERSION;

/// Names the version the sim reports, over its file name's.
pub const DRIVER_VERSION_ENV: &str = "VGPU_SIM_DRIVER_VERSION";

/// The driver version this process reports; decided once.
pub fn driver_version() -> &'static str {
    static VERSION: OnceLock<String> = OnceLock::new();
    VERSION.get_or_init(|| {
        std::env::var(DRIVER_VERSION_ENV)
            .ok()
            .filter(|value| is_version(value))
            .or_else(|| own_file().as_deref().and_then(version_in_file_name))
            .unwrap_or_else(|| DRIVER_VERSION.to_string())
    })
}

/// `535.261.03`: two or three dot-separated numbers.
fn is_version(text: &str) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|part| !part.is_empty() && part.bytes().all(|byte| byte.is_ascii_digit()))
}

/// The version after `.so.` in a library's file name, when it is one.
pub fn version_in_file_name(path: &Path) -> Option<String> {
    let name = path.file_name()?.to_str()?;
    let (_, version) = name.split_once(".so.")?;
    is_version(version).then(|| version.to_string())
}

/// The file this library was loaded from, links resolved.
fn own_file() -> Option<PathBuf> {
    // SAFETY: Dl_info is plain data (pointers and integers); all zeroes is a valid value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let address = driver_version as *const () as *const libc::c_void;
    // SAFETY: dladdr only reads `address` (a function of this object) and fills `info`.
    let found = unsafe { libc::dladdr(address, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname, when set, is a NUL-terminated path the loader owns for as long
    // as the object stays loaded (this function is in it); it is copied at once.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    std::fs::canonicalize(OsStr::from_bytes(name.to_bytes())).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_versioned_library_file_name_gives_its_version() {
        let cases = [
            ("/x/libnvidia-ml.so.535.261.03", Some("535.261.03")),
            ("libcuda.so.580.159.04", Some("580.159.04")),
            ("libcuda.so.1", None),
            ("libvgpu_sim.so", None),
            ("libcuda.so.535.x.03", None),
            ("libcuda.so.535..03", None),
            ("/x/y", None),
        ];
        for (path, want) in cases {
            assert_eq!(
                version_in_file_name(Path::new(path)).as_deref(),
                want,
                "{path}"
            );
        }
    }
}

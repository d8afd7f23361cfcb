//! `ld.so.cache`, as `vgpu-ldconfig` reads a host's (a file a node's owner controls,
//! read by the plugin's init container): any bytes either fail with an error or give
//! entries whose names and paths came from inside the file.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = vgpu_ldconfig::parse_cache(data) {
        for entry in &entries {
            // Every string is a NUL-free piece of the input.
            assert!(!entry.name.contains('\0'));
            assert!(entry.name.len() < data.len());
            assert!(entry.path.as_os_str().len() < data.len());
        }
        for name in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            let _ = vgpu_ldconfig::loader_paths(name, &entries, None);
        }
    }
});

//! The quota config, as the shims and the host read a tenant-reachable file: any text
//! either fails with an error or gives a valid config that writes back (`to_yaml`) to
//! text that reads back to the same config.

#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use vgpu_contract::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.yaml");
    if let Ok(config) = Config::from_yaml(text, path) {
        assert_eq!(config.validate(), Ok(()));
        let written = config.to_yaml();
        let again = Config::from_yaml(&written, path).unwrap_or_else(|error| {
            panic!("written config does not read back: {error}\n{written}")
        });
        assert_eq!(again, config, "round trip of\n{written}");
    }
});

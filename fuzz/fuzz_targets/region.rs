//! The usage region, as the host and every process of a container read it: the file
//! lies in the container, so a tenant writes any bytes to it. The input makes a valid
//! region (its devices and limits from the input, so the header's checks see every
//! value with a right checksum), then patches any bytes of it (header, slots, limiter
//! words) and may cut it short. Whatever it holds, the host's copy (`RegionSnapshot`)
//! and the shims' mapping (`Region`) either refuse it or read bounded figures.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use vgpu_contract::region::{MAX_SLOTS, REGION_LEN, Region, RegionDevice};
use vgpu_contract::snapshot::RegionSnapshot;

/// Reads the input front to back; zeros past its end.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    fn u8(&mut self) -> u8 {
        self.bytes(1).first().copied().unwrap_or(0)
    }
    fn u32(&mut self) -> u32 {
        let mut word = [0u8; 4];
        let bytes = self.bytes(4);
        word[..bytes.len()].copy_from_slice(bytes);
        u32::from_le_bytes(word)
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
}

fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("vgpu-fuzz-region-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        dir.join("usage.region")
    })
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let devices: Vec<RegionDevice> = (0..input.u8() % 20)
        .map(|_| {
            let len = usize::from(input.u8() % 48);
            RegionDevice {
                id: String::from_utf8_lossy(input.bytes(len)).into_owned(),
                memory_limit: input.u64(),
                core_limit: input.u32(),
                core_mode: input.u32(),
            }
        })
        .collect();
    let path = scratch();
    let _ = std::fs::remove_file(path);
    if Region::create_file(path, &devices).is_err() {
        return;
    }
    let mut bytes = std::fs::read(path).expect("the region just made");
    assert_eq!(bytes.len(), REGION_LEN);
    for _ in 0..input.u8() % 16 {
        let at = input.u32() as usize % REGION_LEN;
        let len = usize::from(input.u8());
        let patch = input.bytes(len).to_vec();
        let end = (at + patch.len()).min(REGION_LEN);
        bytes[at..end].copy_from_slice(&patch[..end - at]);
    }
    if input.u8() == 0xff {
        bytes.truncate(input.u32() as usize % REGION_LEN);
    }
    std::fs::write(path, &bytes).expect("write the patched region");

    if let Ok(copy) = RegionSnapshot::read(path) {
        let devices = copy.devices();
        assert!(devices.len() <= vgpu_contract::config::MAX_DEVICES);
        for device in 0..=devices.len() {
            let _ = copy.device_used(device);
            let _ = copy.container_limiter(device);
            for slot in [0, 1, MAX_SLOTS - 1, MAX_SLOTS] {
                let _ = copy.slot_limiter(slot, device);
            }
        }
        assert!(copy.processes().len() <= MAX_SLOTS);
    }
    if let Ok(region) = Region::open_existing(path) {
        let devices = region.devices();
        for device in 0..=devices.len() {
            let _ = region.device_used(device);
        }
        assert!(region.processes().len() <= MAX_SLOTS);
        let _ = region.reclaim_dead();
    }
});

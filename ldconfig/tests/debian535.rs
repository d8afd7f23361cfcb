//! Against the real Debian 535 driver: the export reader reproduces the checked-in lists,
//! and `prepare` builds the driver folder from a hand-built loader cache, refusing a shim
//! that lacks exports, and gives another driver version a folder of its own.

mod common;

use vgpu_test_support::{Need, require};

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use common::{DEBIAN_VERSION, build_shim, sha256sum, symbol_list, unpack_debian_driver};
use vgpu_ldconfig::cache::build::{X86_64_LIBC6, new_format};
use vgpu_ldconfig::discover::{CacheSource, DiscoverOptions, VersionSource, discover};
use vgpu_ldconfig::exports::{defined_functions, soname};
use vgpu_ldconfig::prepare::{Manifest, PrepareError, PrepareOptions, prepare};
use vgpu_ldconfig::{loader_paths, parse_cache, read_cache};

#[test]
fn real_535_exports_equal_the_checked_in_lists() {
    require!(Need::DebianDebs);
    let driver = unpack_debian_driver();
    let cuda = driver.lib_dir.join(format!("libcuda.so.{DEBIAN_VERSION}"));
    let nvml = driver
        .lib_dir
        .join(format!("libnvidia-ml.so.{DEBIAN_VERSION}"));
    let cuda_exports = defined_functions(&cuda).unwrap();
    assert_eq!(
        cuda_exports,
        symbol_list(&format!("libcuda.so.{DEBIAN_VERSION}.txt"))
    );
    assert_eq!(
        defined_functions(&nvml).unwrap(),
        symbol_list(&format!("libnvidia-ml.so.{DEBIAN_VERSION}.txt"))
    );
    assert!(cuda_exports.contains("cuGetProcAddress_v2"));
    assert_eq!(soname(&cuda).unwrap().as_deref(), Some("libcuda.so.1"));
    assert_eq!(soname(&nvml).unwrap().as_deref(), Some("libnvidia-ml.so.1"));
}

/// A loader cache file naming the unpacked libraries, written into `dir`.
fn write_cache(dir: &Path, lib_dir: &Path) -> PathBuf {
    let cuda = lib_dir.join("libcuda.so.1").to_string_lossy().into_owned();
    let nvml = lib_dir
        .join("libnvidia-ml.so.1")
        .to_string_lossy()
        .into_owned();
    let bytes = new_format(&[
        ("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", X86_64_LIBC6),
        ("libnvidia-ml.so.1", &nvml, X86_64_LIBC6),
        ("libcuda.so.1", &cuda, X86_64_LIBC6),
    ]);
    let path = dir.join("ld.so.cache");
    std::fs::write(&path, bytes).unwrap();
    path
}

fn options_for(cache: &Path, tool_dir: &Path) -> DiscoverOptions {
    DiscoverOptions {
        cache: CacheSource::Entries(read_cache(cache).unwrap()),
        tool_dirs: vec![tool_dir.to_path_buf()],
        ..DiscoverOptions::default()
    }
}

#[test]
fn prepare_builds_the_driver_folder_and_guards_exports() {
    require!(Need::DebianDebs);
    let driver_files = unpack_debian_driver();
    let work = tempfile::tempdir().unwrap();
    let cache = write_cache(work.path(), &driver_files.lib_dir);
    let driver = discover(&options_for(&cache, &driver_files.tool_dir)).unwrap();
    assert_eq!(driver.version.as_deref(), Some(DEBIAN_VERSION));
    assert_eq!(driver.version_source, Some(VersionSource::LibcudaFileName));
    assert_eq!(driver.libraries.len(), 2, "{:?}", driver.libraries);
    assert!(driver.tools.contains_key("nvidia-smi"));
    assert_eq!(
        loader_paths(
            "libcuda.so.1",
            &parse_cache(&std::fs::read(&cache).unwrap()).unwrap(),
            None
        ),
        [driver_files.lib_dir.join("libcuda.so.1")]
    );

    let cuda_names = symbol_list(&format!("libcuda.so.{DEBIAN_VERSION}.txt"));
    let nvml_names = symbol_list(&format!("libnvidia-ml.so.{DEBIAN_VERSION}.txt"));
    let base = work.path().join("driver");
    let dest = base.join(DEBIAN_VERSION);
    let shims = work.path().join("shims");
    std::fs::create_dir(&shims).unwrap();
    let options = |driver| PrepareOptions {
        dest: base.clone(),
        shim_dir: shims.clone(),
        driver,
        force: false,
        verify: false,
        allow_missing_exports: false,
        keep_previous: 1,
    };

    // 1. No shims at all.
    let error = prepare(&options(driver.clone())).unwrap_err();
    assert!(matches!(error, PrepareError::MissingShim { .. }), "{error}");

    // 2. A CUDA shim with only a few exports is refused, naming what it lacks.
    build_shim(
        &shims.join("libcuda_shim.so"),
        ["cuInit", "cuDriverGetVersion", "cuGetProcAddress"],
    );
    build_shim(
        &shims.join("libnvml_shim.so"),
        nvml_names.iter().map(String::as_str),
    );
    let error = prepare(&options(driver.clone())).unwrap_err();
    let PrepareError::ShimLacksExports(reports) = &error else {
        panic!("unexpected {error}")
    };
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].missing.len(), cuda_names.len() - 3);
    assert!(
        reports[0]
            .missing
            .iter()
            .any(|name| name == "cuMemAlloc_v2")
    );
    assert!(!reports[0].missing.iter().any(|name| name == "cuInit"));
    // For an operator: the summary, one line per missing name, the fix.
    let lines = error.lines();
    assert!(lines[0].starts_with("refusing to deploy: "), "{lines:?}");
    assert!(
        lines[0].contains("lacks 617 of the 620 exports"),
        "{lines:?}"
    );
    assert_eq!(lines.len(), 1 + 617 + 1);
    for name in ["cuMemAlloc_v2", "cuArray3DCreate"] {
        assert!(
            lines
                .iter()
                .any(|line| line.ends_with(&format!(": {name}"))),
            "{name} has no line"
        );
    }
    assert!(lines.last().unwrap().contains("--allow-missing-exports"));
    assert!(
        !base.exists(),
        "nothing may be written when the check fails"
    );
    // Unless told to go on anyway: the check is still reported.
    let anyway_base = work.path().join("anyway");
    let anyway = prepare(&PrepareOptions {
        dest: anyway_base.clone(),
        allow_missing_exports: true,
        ..options(driver.clone())
    })
    .unwrap();
    assert_eq!(
        anyway
            .checks
            .iter()
            .filter(|report| !report.is_complete())
            .count(),
        1
    );
    assert!(anyway_base.join("current/shim/libcuda_shim.so").is_file());

    // 3. A shim with every name (plus an extra) passes, and the folder is laid out.
    build_shim(
        &shims.join("libcuda_shim.so"),
        cuda_names
            .iter()
            .map(String::as_str)
            .chain(["vgpuExtraExport"]),
    );
    let outcome = prepare(&options(driver.clone())).unwrap();
    assert!(outcome.checks.iter().all(|report| report.is_complete()));
    assert_eq!(outcome.checks.len(), 2);
    assert_eq!(outcome.version_dir, dest);
    assert_eq!(outcome.replaced, None);
    assert_eq!(
        std::fs::read_link(base.join("current")).unwrap(),
        Path::new(DEBIAN_VERSION)
    );
    assert_eq!(vgpu_ldconfig::prepared_dir(&base), dest);
    let lib64 = dest.join("lib64");
    let cuda_file = format!("libcuda.so.{DEBIAN_VERSION}");
    let nvml_file = format!("libnvidia-ml.so.{DEBIAN_VERSION}");
    assert!(
        std::fs::symlink_metadata(lib64.join(&cuda_file))
            .unwrap()
            .is_file()
    );
    assert_eq!(
        std::fs::read_link(lib64.join("libcuda.so.1")).unwrap(),
        Path::new(&cuda_file)
    );
    assert_eq!(
        std::fs::read_link(lib64.join("libcuda.so")).unwrap(),
        Path::new("libcuda.so.1")
    );
    assert_eq!(
        std::fs::read_link(lib64.join("libnvidia-ml.so.1")).unwrap(),
        Path::new(&nvml_file)
    );
    assert_eq!(
        std::fs::read_link(lib64.join("libnvidia-ml.so")).unwrap(),
        Path::new("libnvidia-ml.so.1")
    );
    assert_eq!(
        sha256sum(&lib64.join(&cuda_file)),
        sha256sum(&driver_files.lib_dir.join(&cuda_file))
    );
    assert!(dest.join("bin/nvidia-smi").is_file());
    assert!(dest.join("shim/libcuda_shim.so").is_file());
    assert!(dest.join("shim/libnvml_shim.so").is_file());
    // The prepared folder is itself a valid driver: its exports are the real ones.
    assert_eq!(
        defined_functions(&lib64.join("libcuda.so.1")).unwrap(),
        cuda_names
    );

    let manifest = Manifest::read(&dest).unwrap().unwrap();
    assert_eq!(manifest.version, DEBIAN_VERSION);
    let entry = manifest
        .files
        .iter()
        .find(|file| file.path == format!("lib64/{cuda_file}"))
        .unwrap();
    assert_eq!(
        entry.sha256,
        sha256sum(&driver_files.lib_dir.join(&cuda_file))
    );
    assert_eq!(
        entry.size,
        std::fs::metadata(driver_files.lib_dir.join(&cuda_file))
            .unwrap()
            .len()
    );
    assert_eq!(manifest.files.len(), 2 + 1 + 2);
    assert_eq!(manifest.links.len(), 4);
    let raw: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dest.join("driver.json")).unwrap()).unwrap();
    assert_eq!(raw["version"], DEBIAN_VERSION);

    // 4. Idempotent: a second run changes nothing and rewrites nothing.
    let mtime = std::fs::metadata(lib64.join(&cuda_file))
        .unwrap()
        .modified()
        .unwrap();
    let again = prepare(&options(driver.clone())).unwrap();
    assert!(again.changed.is_empty(), "{:?}", again.changed);
    assert!(again.removed.is_empty());
    assert_eq!(
        std::fs::metadata(lib64.join(&cuda_file))
            .unwrap()
            .modified()
            .unwrap(),
        mtime
    );
    // A damaged copy (other size) is repaired.
    std::fs::write(lib64.join(&nvml_file), b"damaged").unwrap();
    let repaired = prepare(&options(driver.clone())).unwrap();
    assert_eq!(
        repaired.changed,
        [format!("lib64/{nvml_file}"), "driver.json".to_string()]
    );
    assert_eq!(
        sha256sum(&lib64.join(&nvml_file)),
        sha256sum(&driver_files.lib_dir.join(&nvml_file))
    );
    // Same-size damage with the old modification time restored passes the fast check,
    // and is caught by `verify`.
    let nvml_copy = lib64.join(&nvml_file);
    let recorded_mtime = std::fs::metadata(&nvml_copy).unwrap().modified().unwrap();
    let mut bytes = std::fs::read(&nvml_copy).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&nvml_copy, &bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&nvml_copy)
        .unwrap()
        .set_modified(recorded_mtime)
        .unwrap();
    assert!(
        prepare(&options(driver.clone()))
            .unwrap()
            .changed
            .is_empty()
    );
    let verified = prepare(&PrepareOptions {
        verify: true,
        ..options(driver.clone())
    })
    .unwrap();
    assert!(
        verified.changed.contains(&format!("lib64/{nvml_file}")),
        "{:?}",
        verified.changed
    );
    assert_eq!(
        sha256sum(&nvml_copy),
        sha256sum(&driver_files.lib_dir.join(&nvml_file))
    );

    // 5. Another driver version gets a folder of its own; `current` switches to it and
    // the first is kept for the containers that mounted it.
    let other = work.path().join("other");
    std::fs::create_dir(&other).unwrap();
    std::fs::copy(
        driver_files.lib_dir.join(&cuda_file),
        other.join("libcuda.so.999.1.2"),
    )
    .unwrap();
    std::fs::copy(
        driver_files.lib_dir.join(&nvml_file),
        other.join("libnvidia-ml.so.999.1.2"),
    )
    .unwrap();
    symlink("libcuda.so.999.1.2", other.join("libcuda.so.1")).unwrap();
    symlink("libnvidia-ml.so.999.1.2", other.join("libnvidia-ml.so.1")).unwrap();
    let other_driver = discover(&DiscoverOptions {
        extra_dirs: vec![other.clone()],
        ..DiscoverOptions::default()
    })
    .unwrap();
    assert_eq!(other_driver.version.as_deref(), Some("999.1.2"));
    let upgraded = prepare(&options(other_driver)).unwrap();
    assert_eq!(upgraded.manifest.version, "999.1.2");
    assert_eq!(upgraded.replaced.as_deref(), Some(DEBIAN_VERSION));
    assert!(upgraded.pruned.is_empty());
    assert_eq!(upgraded.version_dir, base.join("999.1.2"));
    assert_eq!(
        std::fs::read_link(base.join("999.1.2/lib64/libcuda.so.1")).unwrap(),
        Path::new("libcuda.so.999.1.2")
    );
    assert_eq!(
        std::fs::read_link(base.join("current")).unwrap(),
        Path::new("999.1.2")
    );
    // The old folder is untouched: a container that mounted it still has every file.
    assert!(lib64.join(&cuda_file).is_file());
    assert!(dest.join("bin/nvidia-smi").is_file());
    assert_eq!(
        sha256sum(&lib64.join(&cuda_file)),
        sha256sum(&driver_files.lib_dir.join(&cuda_file))
    );

    // 6. A corrupt manifest of a version folder is refused unless forced.
    std::fs::write(base.join("999.1.2/driver.json"), b"{ not json").unwrap();
    let again = discover(&DiscoverOptions {
        extra_dirs: vec![other.clone()],
        ..DiscoverOptions::default()
    })
    .unwrap();
    let error = prepare(&options(again.clone())).unwrap_err();
    assert!(matches!(error, PrepareError::BadManifest { .. }), "{error}");
    assert!(error.to_string().contains("--force"));
    let forced = prepare(&PrepareOptions {
        force: true,
        ..options(again)
    })
    .unwrap();
    assert_eq!(forced.manifest.version, "999.1.2");
    assert!(Manifest::read(&base.join("999.1.2")).unwrap().is_some());
}

//! `symbols/add-driver.sh`: regenerating the 535 lists from the Debian packages gives
//! byte-for-byte the checked-in files, and bad arguments are refused.

mod common;

use vgpu_test_support::{Need, require};

use std::process::{Command, Output};

use common::{DEBIAN_VERSION, symbols_file, unpack_debian_driver};

fn add_driver(out_dir: &std::path::Path, args: &[&std::path::Path]) -> Output {
    Command::new("bash")
        .arg(symbols_file("add-driver.sh"))
        .args(args)
        .env("VGPU_SYMBOLS_DIR", out_dir)
        .output()
        .unwrap()
}

#[test]
fn regenerates_the_checked_in_535_lists_exactly() {
    require!(Need::DebianDebs);
    let driver = unpack_debian_driver();
    let out = tempfile::tempdir().unwrap();
    // Arguments in either order, and a SONAME symlink instead of the versioned file.
    let output = add_driver(
        out.path(),
        &[
            &driver.lib_dir.join("libnvidia-ml.so.1"),
            &driver.lib_dir.join(format!("libcuda.so.{DEBIAN_VERSION}")),
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for name in [
        format!("libcuda.so.{DEBIAN_VERSION}.txt"),
        format!("libnvidia-ml.so.{DEBIAN_VERSION}.txt"),
    ] {
        let made = std::fs::read(out.path().join(&name)).unwrap();
        let checked_in = std::fs::read(symbols_file(&name)).unwrap();
        assert!(
            made == checked_in,
            "{name} differs from the checked-in list"
        );
    }
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("cargo build --release -p libcuda-shim -p libnvml-shim"),
        "{stdout}"
    );
    assert!(stdout.contains("(620 names)"), "{stdout}");
    assert_eq!(
        std::fs::read_dir(out.path()).unwrap().count(),
        2,
        "temporary files left behind"
    );
}

#[test]
fn refuses_wrong_arguments() {
    require!(Need::DebianDebs);
    let driver = unpack_debian_driver();
    let out = tempfile::tempdir().unwrap();
    let cuda = driver.lib_dir.join(format!("libcuda.so.{DEBIAN_VERSION}"));
    let renamed = out.path().join("libnvidia-ml.so.535.261.03");
    std::fs::copy(&cuda, &renamed).unwrap();
    let unversioned = out.path().join("libcuda.so.1");
    std::fs::copy(&cuda, &unversioned).unwrap();
    let cases: Vec<(Vec<&std::path::Path>, &str)> = vec![
        (vec![&cuda], "expected 2 arguments"),
        (vec![&cuda, &cuda], "two libcuda files"),
        (
            vec![
                &cuda,
                std::path::Path::new("/nonexistent/libnvidia-ml.so.1"),
            ],
            "does not exist",
        ),
        (vec![&cuda, &renamed], "does not export nvmlInit_v2"),
        (
            vec![&unversioned, &renamed],
            "does not end in a driver version",
        ),
        (
            vec![&cuda, std::path::Path::new("/etc/hostname")],
            "neither libcuda",
        ),
    ];
    for (args, expected) in cases {
        let output = add_driver(out.path(), &args);
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
    // Nothing but the two fixture copies is left.
    assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 2);
}

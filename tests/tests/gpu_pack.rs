//! `tests/gpu/pack.sh`, which packs what a device call carries to the GPU machine: a
//! `vgpu install` with the pod section's tools beside it and a runc that finds its own
//! libraries. A session's device time starts with this folder, and the GPU machine has
//! no cargo and no runc, so a pack that is missing a piece must fail here, not there.
//! Packed here from this profile's build (debug in `cargo test`, stripped like a
//! release one).
//!
//! Needs runc, patchelf and binutils (`tests/run.sh` installs them), and `vgpu`,
//! `vgpu-ldconfig` and the plugin's `pod_harness` example of this build.

use std::path::Path;
use std::process::{Command, Output};

use vgpu_test_support::{Need, profile_dir, repo_root, require};

fn pack(dest: &Path, profile: &Path) -> Output {
    Command::new("bash")
        .arg(repo_root().join("tests/gpu/pack.sh"))
        .arg(dest)
        .arg(profile)
        .output()
        .expect("run tests/gpu/pack.sh")
}

fn shown(output: &Output) -> String {
    format!(
        "{}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn run(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("{program}: {err}"))
}

fn prerequisites_present() -> bool {
    let harness = profile_dir().join("examples/pod_harness");
    require!(return false;
        Need::program("runc", "apt-get install runc"),
        Need::program("patchelf", "apt-get install patchelf"),
        Need::program("readelf", "apt-get install binutils"),
        Need::Built("vgpu"),
        Need::Built("vgpu-ldconfig"),
        Need::Other {
            what: "pod_harness (the plugin's example) of this build",
            present: harness.is_file(),
            install: "cargo build -p vgpu-plugin --example pod_harness",
        },
    );
    true
}

#[test]
fn the_pack_holds_the_install_the_pod_tools_and_a_runc_that_finds_its_own_libraries() {
    if !prerequisites_present() {
        return;
    }
    let scratch = tempfile::tempdir().expect("tempdir");
    let dest = scratch.path().join("pack");
    // A file left from an earlier pack must not travel again.
    std::fs::create_dir_all(dest.join("bin")).expect("mkdir");
    std::fs::write(dest.join("bin/stale"), b"old").expect("write");

    let output = pack(&dest, &profile_dir());
    assert!(output.status.success(), "pack.sh: {}", shown(&output));
    for file in [
        "bin/vgpu",
        "bin/vgpu-ldconfig",
        "bin/pod_harness",
        "bin/runc",
        "lib64/libcuda.so.1",
        "lib64/libnvidia-ml.so.1",
        "sim/lib64/libvgpu_sim.so",
    ] {
        assert!(
            dest.join(file).is_file(),
            "{file} not packed: {}",
            shown(&output)
        );
    }
    for absent in ["bin/stale", "bin/vgpu-plugin", "bin/vgpu-dra-plugin"] {
        assert!(!dest.join(absent).exists(), "{absent} packed");
    }

    // Every library runc needs beyond the C library resolves inside the pack, by the run
    // path, with nothing set in the environment.
    let runc = dest.join("bin/runc");
    let ldd = run("ldd", &[runc.to_str().expect("utf-8 path")]);
    let listing = String::from_utf8_lossy(&ldd.stdout).to_string();
    let outside: Vec<&str> = listing
        .lines()
        .filter(|line| line.contains("=>"))
        .filter(|line| {
            let name = line.split_whitespace().next().unwrap_or_default();
            ![
                "libc.so",
                "libm.so",
                "libpthread.so",
                "libdl.so",
                "librt.so",
            ]
            .iter()
            .any(|glibc| name.starts_with(glibc))
        })
        .filter(|line| !line.contains(&format!("{}/bin/../lib/", dest.display())))
        .collect();
    assert!(
        outside.is_empty(),
        "runc's libraries found outside the pack: {outside:?}\n{listing}"
    );
    assert!(
        listing.contains("libseccomp"),
        "Debian's runc links libseccomp: {listing}"
    );
    let version = Command::new(&runc)
        .arg("--version")
        .env_clear()
        .output()
        .expect("run the packed runc");
    assert!(version.status.success(), "packed runc: {}", shown(&version));

    // Stripped: no symbol table left in any of the binaries.
    for file in [
        "bin/vgpu",
        "bin/pod_harness",
        "lib64/libcuda.so.1",
        "bin/runc",
    ] {
        let sections = run("readelf", &["-S", dest.join(file).to_str().expect("utf-8")]);
        let sections = String::from_utf8_lossy(&sections.stdout);
        assert!(!sections.contains(".symtab"), "{file} not stripped");
    }
}

#[test]
fn a_pack_from_a_missing_build_fails_clearly_and_leaves_the_old_pack() {
    if !prerequisites_present() {
        return;
    }
    let scratch = tempfile::tempdir().expect("tempdir");
    let dest = scratch.path().join("pack");
    std::fs::create_dir_all(&dest).expect("mkdir");
    std::fs::write(dest.join("kept"), b"an earlier pack").expect("write");
    let empty = scratch.path().join("no-build");
    std::fs::create_dir_all(&empty).expect("mkdir");

    let output = pack(&dest, &empty);
    assert!(
        !output.status.success(),
        "pack.sh packed nothing: {}",
        shown(&output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.lines().count() == 1 && stderr.contains("build first"),
        "one clear line: {stderr}"
    );
    assert!(dest.join("kept").is_file(), "the old pack was removed");
}

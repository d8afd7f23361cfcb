//! The `vgpu-ldconfig` binary: exit codes and output of `check`, and that `scan`,
//! `prepare` and `layout` print what the library computes.

mod common;

use vgpu_test_support::{Need, require};

use std::path::Path;

use common::{
    DEBIAN_VERSION, build_shim, symbol_list, symbols_file, unpack_debian_driver, vgpu_ldconfig,
};
use vgpu_ldconfig::cache::build::{X86_64_LIBC6, new_format};

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn check_against_a_list_exits_1_and_prints_missing_names_sorted() {
    let work = tempfile::tempdir().unwrap();
    let shim = work.path().join("libcuda_shim.so");
    build_shim(&shim, ["cuInit", "cuDriverGetVersion", "notInTheList"]);
    let list = symbols_file(&format!("libcuda.so.{DEBIAN_VERSION}.txt"));
    let output = vgpu_ldconfig(&["check", "--real-list", path(&list), "--shim", path(&shim)]);
    assert_eq!(output.status.code(), Some(1));
    let printed: Vec<String> = text(&output.stdout).lines().map(str::to_string).collect();
    let mut expected: Vec<String> = symbol_list(&format!("libcuda.so.{DEBIAN_VERSION}.txt"))
        .into_iter()
        .collect();
    expected.retain(|name| name != "cuInit" && name != "cuDriverGetVersion");
    assert_eq!(printed, expected);
    let mut sorted = printed.clone();
    sorted.sort();
    assert_eq!(printed, sorted);
    assert!(text(&output.stderr).contains(&format!("lacks {} of", expected.len())));
}

#[test]
fn check_of_a_complete_shim_exits_0_with_one_summary_line() {
    require!(Need::DebianDebs);
    let driver = unpack_debian_driver();
    let work = tempfile::tempdir().unwrap();
    let shim = work.path().join("libnvml_shim.so");
    let names = symbol_list(&format!("libnvidia-ml.so.{DEBIAN_VERSION}.txt"));
    build_shim(&shim, names.iter().map(String::as_str));
    let real = driver
        .lib_dir
        .join(format!("libnvidia-ml.so.{DEBIAN_VERSION}"));
    let output = vgpu_ldconfig(&["check", "--real", path(&real), "--shim", path(&shim)]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.contains(&format!("exports all {} names", names.len())),
        "{stdout}"
    );
}

#[test]
fn bad_input_is_one_error_line_and_exit_2() {
    let work = tempfile::tempdir().unwrap();
    let not_elf = work.path().join("notelf.so");
    std::fs::write(&not_elf, "text").unwrap();
    let list = symbols_file(&format!("libcuda.so.{DEBIAN_VERSION}.txt"));
    for args in [
        vec![
            "check",
            "--real-list",
            path(&list),
            "--shim",
            path(&not_elf),
        ],
        vec![
            "check",
            "--real-list",
            "/nonexistent/list.txt",
            "--shim",
            path(&not_elf),
        ],
        vec!["scan", "--cache", path(&not_elf)],
    ] {
        let output = vgpu_ldconfig(&args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = text(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.starts_with("vgpu-ldconfig: "), "{stderr}");
        assert!(
            stderr.matches("os error").count() <= 1,
            "cause printed twice: {stderr}"
        );
        assert!(output.stdout.is_empty());
    }
}

#[test]
fn scan_prepare_and_layout_from_the_command_line() {
    require!(Need::DebianDebs);
    let driver = unpack_debian_driver();
    let work = tempfile::tempdir().unwrap();
    let cache = work.path().join("ld.so.cache");
    let cuda = driver.lib_dir.join("libcuda.so.1");
    std::fs::write(
        &cache,
        new_format(&[("libcuda.so.1", path(&cuda), X86_64_LIBC6)]),
    )
    .unwrap();

    // `--driver-root /` and no kernel module file: the machine's own
    // /run/nvidia/driver (a GPU Operator's, or tests/k8s's sim node) must not be found.
    let output = vgpu_ldconfig(&[
        "scan",
        "--driver-root",
        "/",
        "--proc-version",
        "/nonexistent",
        "--cache",
        path(&cache),
        "--extra-dir",
        path(&driver.lib_dir),
        "--json",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let scan: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    // No kernel module file: the libraries' names tell the version.
    assert_eq!(scan["version"], DEBIAN_VERSION);
    let sonames: Vec<&str> = scan["libraries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|library| library["soname"].as_str().unwrap())
        .collect();
    assert_eq!(sonames, ["libcuda.so.1", "libnvidia-ml.so.1"]);

    let shims = work.path().join("shims");
    std::fs::create_dir(&shims).unwrap();
    let cuda_names = symbol_list(&format!("libcuda.so.{DEBIAN_VERSION}.txt"));
    build_shim(
        &shims.join("libcuda_shim.so"),
        cuda_names.iter().map(String::as_str),
    );
    build_shim(&shims.join("libnvml_shim.so"), ["nvmlInit_v2"]);
    let dest = work.path().join("driver");
    let prepare_args = [
        "prepare",
        "--dest",
        path(&dest),
        "--shim-dir",
        path(&shims),
        "--cache",
        path(&cache),
        "--extra-dir",
        path(&driver.lib_dir),
        "--driver-root",
        "/",
        "--proc-version",
        "/nonexistent",
    ];
    let refused = vgpu_ldconfig(&prepare_args);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = text(&refused.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    let nvml_count = symbol_list(&format!("libnvidia-ml.so.{DEBIAN_VERSION}.txt")).len();
    // The summary, one line per missing name, the fix; every line prefixed.
    assert_eq!(lines.len(), 1 + (nvml_count - 1) + 1, "{stderr}");
    assert!(lines.iter().all(|line| line.starts_with("vgpu-ldconfig: ")));
    assert!(lines[0].contains("refusing to deploy"), "{stderr}");
    assert!(
        lines.contains(
            &format!(
                "vgpu-ldconfig: missing in {}: nvmlDeviceGetMemoryInfo",
                shims.join("libnvml_shim.so").display()
            )
            .as_str()
        ),
        "{stderr}"
    );
    assert!(lines[lines.len() - 1].contains("--allow-missing-exports"));
    assert!(!dest.exists(), "nothing written when refused");
    // Going on anyway is one explicit option.
    let anyway_dest = work.path().join("anyway");
    let mut anyway_args = prepare_args.to_vec();
    anyway_args[2] = path(&anyway_dest);
    anyway_args.push("--allow-missing-exports");
    let anyway = vgpu_ldconfig(&anyway_args);
    assert!(anyway.status.success(), "{}", text(&anyway.stderr));
    assert!(
        text(&anyway.stdout).contains("deploying anyway (--allow-missing-exports)"),
        "{}",
        text(&anyway.stdout)
    );
    assert!(anyway_dest.join("current/shim/libnvml_shim.so").is_file());

    let nvml_names = symbol_list(&format!("libnvidia-ml.so.{DEBIAN_VERSION}.txt"));
    build_shim(
        &shims.join("libnvml_shim.so"),
        nvml_names.iter().map(String::as_str),
    );
    let done = vgpu_ldconfig(&prepare_args);
    assert!(done.status.success(), "{}", text(&done.stderr));
    let stdout = text(&done.stdout);
    assert!(
        stdout.starts_with(&format!(
            "vgpu-ldconfig {} (commit ",
            env!("CARGO_PKG_VERSION")
        )),
        "the version is the first line: {stdout}"
    );
    assert!(stdout.contains("prepared"));
    assert!(dest.join("current/lib64/libnvidia-ml.so.1").exists());
    let again = vgpu_ldconfig(&prepare_args);
    assert!(
        text(&again.stdout).contains("already up to date"),
        "{}",
        text(&again.stdout)
    );

    let layout = vgpu_ldconfig(&["layout", "--json", "--host-driver-dir", path(&dest)]);
    assert!(layout.status.success());
    let layout: serde_json::Value = serde_json::from_slice(&layout.stdout).unwrap();
    assert_eq!(
        layout["env"]["VGPU_DRIVER_DIR"],
        "/usr/local/vgpu/driver/lib64"
    );
    // What a container started now mounts: the version folder `current` names.
    let version_dir = vgpu_ldconfig::prepared_dir(&dest);
    assert_ne!(version_dir, dest);
    assert_eq!(layout["mounts"][0]["host_path"], path(&version_dir));
    // A folder nothing was prepared in (not the machine's /var/lib/vgpu/driver, which a
    // node of tests/k8s may have filled): the plain lines name the folder itself.
    let unprepared = work.path().join("unprepared");
    let plain = text(&vgpu_ldconfig(&["layout", "--host-driver-dir", path(&unprepared)]).stdout);
    let wanted = format!(
        "mount {}/shim/libcuda_shim.so => /usr/lib64/libcuda.so.1 (ro)",
        unprepared.display()
    );
    assert!(plain.contains(&wanted), "{plain}");
}

#[test]
fn exports_prints_the_symbols_list_format() {
    require!(Need::DebianDebs);
    let driver = unpack_debian_driver();
    let cuda = driver.lib_dir.join("libcuda.so.1");
    let output = vgpu_ldconfig(&["exports", path(&cuda)]);
    assert!(output.status.success());
    let checked_in =
        std::fs::read_to_string(symbols_file(&format!("libcuda.so.{DEBIAN_VERSION}.txt"))).unwrap();
    assert_eq!(text(&output.stdout), checked_in);
    let output = vgpu_ldconfig(&["exports", "--soname", path(&cuda)]);
    assert_eq!(text(&output.stdout), "libcuda.so.1\n");
}

#[test]
fn version_names_the_workspace_version_and_the_commit() {
    let output = vgpu_ldconfig(&["--version"]);
    assert!(output.status.success());
    let line = text(&output.stdout);
    assert_eq!(
        line.trim(),
        format!("vgpu-ldconfig {}", vgpu_build_info::VERSION_LINE)
    );
    assert!(line.contains(&format!("(commit {})", vgpu_build_info::COMMIT)));
}

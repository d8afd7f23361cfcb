//! `tests/k8s/kubelet-dial`: a Go program that calls a plugin's unix sockets the way
//! kubelet v1.37.2 does, on the grpc-go kubelet is built with (its go.mod pins both).
//! The stand-in kubelets of the tests are tonic, which dials differently (it sends a
//! valid `:authority` where kubelet's plugin watcher sends the socket's path), so the
//! DRA driver's and the device plugin's tests run this too.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::prerequisites::Need;

/// The Go module, from this crate's folder.
fn module() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/k8s/kubelet-dial")
}

/// `kubelet-dial`, built once per test process into `target/<profile>/` (Go's build
/// cache makes a rebuild take a second); `None` without Go, by the prerequisite policy
/// (skipped outside CI, a failure in CI). A failed build fails the test.
pub fn kubelet_dial() -> Option<PathBuf> {
    let go = Need::Program {
        name: "go",
        probe: "version",
        install: "Go 1.26 from go.dev, which tests/run.sh's machines have",
    };
    if !crate::prerequisites::present(&[go]) {
        return None;
    }
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let output = crate::built::profile_dir().join("kubelet-dial");
        // Built under a name of this process's, then renamed: test binaries build it at
        // the same time.
        let building = output.with_extension(format!("{}", std::process::id()));
        let build = Command::new("go")
            .args(["build", "-mod=readonly", "-buildvcs=false", "-o"])
            .arg(&building)
            .arg(".")
            .current_dir(module())
            .output()
            .map_err(|err| format!("cannot run go: {err}"))?;
        if !build.status.success() {
            return Err(format!(
                "go build of {} failed: {}",
                module().display(),
                String::from_utf8_lossy(&build.stderr)
            ));
        }
        std::fs::rename(&building, &output).map_err(|err| format!("rename: {err}"))?;
        Ok(output)
    });
    match built {
        Ok(path) => Some(path.clone()),
        Err(why) => panic!("{why}"),
    }
}

/// Runs `kubelet-dial ARGS`: the JSON line it printed on success, else its `error: ...`
/// line (the gRPC status kubelet would log).
pub fn run(program: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|err| format!("cannot run {}: {err}", program.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        Ok(stdout)
    } else {
        Err(format!("{stdout} {}", String::from_utf8_lossy(&out.stderr))
            .trim()
            .to_string())
    }
}

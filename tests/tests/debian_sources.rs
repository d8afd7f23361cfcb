//! `deploy/debian-sources.sh`, which tests/run.sh and deploy/build-image.sh use instead
//! of naming a mirror: the non-free component is derived from the machine's own Debian
//! sources (deb822 and one-line files), and the mirror for debootstrap likewise.

use std::path::Path;
use std::process::Command;

use vgpu_test_support::repo_root;

/// Runs the script over an apt folder and an os-release of our own.
fn run(apt_etc: &Path, os_release: &Path, what: &str) -> String {
    let output = Command::new("bash")
        .arg(repo_root().join("deploy/debian-sources.sh"))
        .arg(what)
        .env("APT_ETC", apt_etc)
        .env("OS_RELEASE", os_release)
        .output()
        .expect("bash");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8")
}

fn machine(sources: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("apt/sources.list.d")).expect("mkdir");
    std::fs::write(
        dir.path().join("os-release"),
        "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\n",
    )
    .expect("os-release");
    for (name, text) in sources {
        std::fs::write(dir.path().join("apt").join(name), text).expect("source");
    }
    dir
}

#[test]
fn non_free_is_added_to_this_releases_own_sources() {
    let dir = machine(&[
        (
            "sources.list.d/debian.sources",
            "Types: deb\n# a comment inside the stanza\nURIs: file:/srv/mirror/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
             Types: deb\nURIs: file:/srv/mirror/debian-security\nSuites: bookworm-security\nComponents: main contrib\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
             Types: deb\nURIs: file:/srv/off\nSuites: bookworm\nComponents: main\nEnabled: no\n",
        ),
        (
            "sources.list.d/other.sources",
            "Types: deb\nURIs: file:/srv/vendor\nSuites: nodistro\nComponents: main\n",
        ),
        (
            "sources.list",
            "deb [arch=amd64,i386 signed-by=/etc/k.gpg] file:/srv/old/debian bookworm main\ndeb-src file:/srv/src bookworm main\n",
        ),
        // Our own earlier output is not an input.
        (
            "sources.list.d/vgpu-nonfree.sources",
            "Types: deb\nURIs: file:/srv/stale\nSuites: bookworm\nComponents: non-free\n",
        ),
    ]);
    let apt = dir.path().join("apt");
    let release = dir.path().join("os-release");
    // The security archive is left alone (its NVIDIA builds are newer than the tests'
    // fixture packages, which are the release's).
    let stanzas = run(&apt, &release, "nonfree");
    assert_eq!(
        stanzas,
        "Types: deb\nURIs: file:/srv/mirror/debian\nSuites: bookworm bookworm-updates\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
         Types: deb\nURIs: file:/srv/old/debian\nSuites: bookworm\nComponents: non-free\nArchitectures: amd64 i386\nSigned-By: /etc/k.gpg\n\n"
    );
    assert_eq!(run(&apt, &release, "mirror"), "file:/srv/mirror/debian\n");
}

#[test]
fn nothing_is_added_where_non_free_is_on_already_and_no_url_is_invented() {
    let dir = machine(&[(
        "sources.list",
        "deb file:/srv/debian bookworm main non-free\n",
    )]);
    let apt = dir.path().join("apt");
    let release = dir.path().join("os-release");
    assert_eq!(run(&apt, &release, "nonfree"), "");
    // A machine with no Debian source of its release: no stanza, no mirror.
    let bare = machine(&[("sources.list", "deb file:/srv/debian trixie main\n")]);
    let apt = bare.path().join("apt");
    assert_eq!(run(&apt, &release, "nonfree"), "");
    assert_eq!(run(&apt, &release, "mirror"), "");
}

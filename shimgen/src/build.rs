//! Build-script side: generate `exports.rs` for one shim.
//!
//! The generated file holds, for the union of every `symbols/<library>.*.txt` list:
//! - `COUNT`, `NAMES` (C strings, sorted) and `idx::<name>` constants;
//! - `SLOTS`: one pointer per name, initially the "driver not loaded" stub, filled with
//!   the real function (or the "missing" stub) when the shim loads;
//! - for each name the shim does not hook, an exported naked trampoline
//!   `jmp qword ptr [rip + SLOTS + 8*i]`: one indirect jump, arguments, variadics and
//!   struct returns untouched;
//! - `HOOKS`: for each hooked name, the address of its hook, which `cuGetProcAddress`
//!   and friends hand out instead of the real pointer;
//! - two build errors: for a target other than x86-64 (the trampolines are x86-64
//!   assembly) and for `panic = "abort"` (hooks turn panics into error codes with
//!   `catch_unwind`, which then cannot catch anything).
//!
//! A hook is any `fn <prefix><Upper>...(` in `src/hooks/*.rs` (written with the shim's
//! `hook!` macro). A hook whose name is in no export list is a build error, so a typo can
//! never silently leave a real function un-hooked.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One shim's build.
pub struct ShimBuild {
    /// Export-list stem in `symbols/`: `libcuda.so` or `libnvidia-ml.so`.
    pub library: &'static str,
    /// The SONAME to give the built library.
    pub soname: &'static str,
    /// Prefix of the API's names: `cu` or `nvml`.
    pub prefix: &'static str,
}

impl ShimBuild {
    /// Generates `$OUT_DIR/exports.rs` and sets the link arguments. Panics (failing the
    /// build with the message) on missing lists or bad hooks: this is build-time only.
    pub fn run(self) {
        let manifest =
            PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
        let symbols_dir = manifest.join("../symbols");
        let hooks_dir = manifest.join("src/hooks");
        println!("cargo:rerun-if-changed={}", symbols_dir.display());
        println!("cargo:rerun-if-changed={}", hooks_dir.display());
        let names = read_lists(&symbols_dir, self.library);
        let hooks = find_hooks(&hooks_dir, self.prefix);
        for (name, module) in &hooks {
            if !names.contains(name) {
                panic!(
                    "hook {name} in src/hooks/{module}.rs is not exported by any {}.* list in symbols/",
                    self.library
                );
            }
        }
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("exports.rs");
        std::fs::write(&out, generate(&names, &hooks)).expect("write exports.rs");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,{}", self.soname);
        // Our own calls to our own exports (hook addresses handed out by
        // cuGetProcAddress) must bind inside the shim.
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,{}",
            symbolic_binding_flag(std::env::var("RUSTC_LINKER").ok().as_deref())
        );
        // Exit and fork handlers point into the shim: it must never be unmapped.
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
}

/// The linker flag that binds the shim's references to its own exported functions
/// locally. GNU ld and lld take `-Bsymbolic-functions`; zig's linker (cargo-zigbuild,
/// which the image build uses to target glibc 2.17) knows only `-Bsymbolic`, which also
/// binds exported data. A shim exports functions only (every export is a trampoline or
/// a hook), so for a shim the two bind exactly the same references.
pub fn symbolic_binding_flag(linker: Option<&str>) -> &'static str {
    let is_zig = linker
        .and_then(|path| Path::new(path).file_name())
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("zigcc") || name == "zig");
    if is_zig {
        "-Bsymbolic"
    } else {
        "-Bsymbolic-functions"
    }
}

/// The sorted union of every `<library>.<version>.txt` in `dir`.
pub fn read_lists(dir: &Path, library: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut lists = 0;
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|err| panic!("read {}: {err}", dir.display()));
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        if !(file_name.starts_with(&format!("{library}.")) && file_name.ends_with(".txt")) {
            continue;
        }
        lists += 1;
        let text = std::fs::read_to_string(entry.path())
            .unwrap_or_else(|err| panic!("read {file_name}: {err}"));
        for line in text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
        {
            if !line.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                panic!("{file_name}: `{line}` is not a C identifier");
            }
            names.insert(line.to_string());
        }
    }
    assert!(
        lists > 0,
        "no {library}.*.txt export lists in {}",
        dir.display()
    );
    names
}

/// `name -> module` for every hook in `dir/*.rs`.
pub fn find_hooks(dir: &Path, prefix: &str) -> BTreeMap<String, String> {
    let mut hooks = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return hooks;
    };
    let mut paths: Vec<_> = entries.flatten().map(|entry| entry.path()).collect();
    paths.sort();
    for path in paths {
        if path.extension().and_then(|e| e.to_str()) != Some("rs") {
            continue;
        }
        let module = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default()
            .to_string();
        if module == "mod" {
            continue;
        }
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
        for name in hook_names(&text, prefix) {
            if let Some(previous) = hooks.insert(name.clone(), module.clone()) {
                panic!("hook {name} is defined in both {previous}.rs and {module}.rs");
            }
        }
    }
    hooks
}

/// Names of `fn <prefix><Upper>...(` definitions in `text`.
fn hook_names(text: &str, prefix: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in text.lines() {
        let line = line.trim_start();
        if line.starts_with("//") {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("fn ") {
            let after = &rest[at + 3..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let boundary_ok = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
            let is_api = name.starts_with(prefix)
                && name[prefix.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_uppercase());
            if boundary_ok && is_api && after[name.len()..].trim_start().starts_with('(') {
                names.push(name);
            }
            rest = after;
        }
    }
    names
}

/// The build errors every shim carries: the trampolines are x86-64 assembly, and the
/// hooks' panic guard needs unwinding.
const TARGET_CHECKS: &str = r#"#[cfg(not(target_arch = "x86_64"))]
compile_error!("vgpu-shimgen's trampolines exist for x86-64 only (each is one `jmp qword ptr [rip + SLOTS + 8*i]`); this target needs its own before a shim can be built for it");
#[cfg(panic = "abort")]
compile_error!("the shims must be built with panic = \"unwind\": every hook turns a panic into the API's error code with catch_unwind, which catches nothing under panic = \"abort\" (the application would die instead)");
"#;

/// The text of `exports.rs`.
pub fn generate(names: &BTreeSet<String>, hooks: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let count = names.len();
    let _ = writeln!(
        out,
        "// @generated by vgpu-shimgen from symbols/*.txt: do not edit."
    );
    out.push_str(TARGET_CHECKS);
    let _ = writeln!(out, "/// Number of driver exports this shim forwards.");
    let _ = writeln!(out, "pub const COUNT: usize = {count};");
    let _ = writeln!(out, "/// Every export, index-aligned with `SLOTS`.");
    let _ = writeln!(out, "pub static NAMES: [&::core::ffi::CStr; COUNT] = [");
    for name in names {
        let _ = writeln!(out, "    c\"{name}\",");
    }
    let _ = writeln!(out, "];");
    let _ = writeln!(out, "/// Slot index of each export.");
    let _ = writeln!(
        out,
        "#[allow(non_upper_case_globals, dead_code)]\npub mod idx {{"
    );
    for (i, name) in names.iter().enumerate() {
        let _ = writeln!(out, "    pub const {name}: usize = {i};");
    }
    let _ = writeln!(out, "}}");
    let _ = writeln!(
        out,
        "/// The real function behind each export; private to the shim (an exported static\n\
         /// would be preemptible, and the trampolines' RIP-relative jump could not reach it).\n\
         pub(crate) static SLOTS: ::vgpu_shimgen::runtime::Slots<COUNT> = ::vgpu_shimgen::runtime::Slots::new(crate::stubs::driver_not_loaded as *mut ::core::ffi::c_void);"
    );
    let _ = writeln!(out, "/// Hook addresses, by slot index.");
    let _ = writeln!(
        out,
        "pub static HOOKS: [Option<unsafe extern \"C\" fn()>; COUNT] = ["
    );
    for name in names {
        match hooks.get(name) {
            Some(module) => {
                let _ = writeln!(
                    out,
                    "    // SAFETY: a hook's address, typed as a generic C function pointer only to be\n    \
                     // stored and handed out; it is only ever called through its own signature.\n    \
                     Some(unsafe {{ ::core::mem::transmute::<*const (), unsafe extern \"C\" fn()>(crate::hooks::{module}::{name} as *const ()) }}),"
                );
            }
            None => {
                let _ = writeln!(out, "    None,");
            }
        }
    }
    let _ = writeln!(out, "];");
    let _ = writeln!(
        out,
        "/// Naked trampolines for the exports the shim does not hook."
    );
    let _ = writeln!(out, "#[allow(non_snake_case)]\nmod trampolines {{");
    for (i, name) in names.iter().enumerate() {
        if hooks.contains_key(name) {
            continue;
        }
        let _ = writeln!(
            out,
            "    #[unsafe(naked)]\n    #[unsafe(no_mangle)]\n    pub unsafe extern \"C\" fn {name}() {{\n        \
             core::arch::naked_asm!(\"jmp qword ptr [rip + {{slots}} + {offset}]\", slots = sym super::SLOTS)\n    }}",
            offset = i * 8
        );
    }
    let _ = writeln!(out, "}}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hooks_and_ignores_helpers() {
        let text = "hook! {\n    fn cuMemAlloc_v2(p: *mut u64, n: usize) -> CUresult |real| { x }\n}\nfn cu_helper() {}\n// fn cuCommented(\nfn custom(\n    fn cuInit (flags: u32)";
        assert_eq!(
            hook_names(text, "cu"),
            vec!["cuMemAlloc_v2".to_string(), "cuInit".to_string()]
        );
        assert_eq!(
            hook_names("fn nvmlInit_v2() fn nvmlx()", "nvml"),
            vec!["nvmlInit_v2".to_string()]
        );
    }

    #[test]
    fn generates_trampolines_only_for_unhooked() {
        let names: BTreeSet<String> = ["cuA", "cuB", "cuC"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let hooks: BTreeMap<String, String> = [("cuB".to_string(), "memory".to_string())].into();
        let text = generate(&names, &hooks);
        assert!(text.contains("pub unsafe extern \"C\" fn cuA()"));
        assert!(!text.contains("fn cuB()"));
        assert!(text.contains("crate::hooks::memory::cuB"));
        assert!(text.contains("[rip + {slots} + 16]"));
        assert!(text.contains("pub const COUNT: usize = 3;"));
        assert!(text.contains("#[cfg(not(target_arch = \"x86_64\"))]\ncompile_error!"));
        assert!(text.contains("#[cfg(panic = \"abort\")]\ncompile_error!"));
        assert_eq!(
            text.matches("// SAFETY: a hook's address").count(),
            1,
            "one SAFETY line per hooked entry"
        );
    }

    #[test]
    fn zig_links_with_bsymbolic_everything_else_with_bsymbolic_functions() {
        for (linker, flag) in [
            (None, "-Bsymbolic-functions"),
            (Some("cc"), "-Bsymbolic-functions"),
            (
                Some("/usr/bin/x86_64-linux-gnu-gcc"),
                "-Bsymbolic-functions",
            ),
            (
                Some(
                    "/root/.cache/cargo-zigbuild/0.24.1/wrappers/b848/zigcc-x86_64-unknown-linux-gnu.2.17-b9e2.sh",
                ),
                "-Bsymbolic",
            ),
            (Some("zig"), "-Bsymbolic"),
        ] {
            assert_eq!(symbolic_binding_flag(linker), flag, "{linker:?}");
        }
    }
}

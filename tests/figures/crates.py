#!/usr/bin/env python3
"""Lines of Rust and unsafe per workspace crate, then the crates' dependency graph: the
figures docs/crate-split-plan.md compares before and after each step.

    python3 tests/figures/crates.py [REPO]      (REPO: a checkout, default `.`)

Per crate folder: Rust lines without blank and comment lines; `src` is everything but
`#[cfg(test)]` modules (inline, or files they name), `tests/`, `examples/`, `benches/`,
which count as tests. Unsafe: `unsafe {` blocks, `unsafe fn` (also `unsafe extern "C" fn`),
`unsafe impl`, in code lines (comments excluded). The graph: per crate its normal
dependencies on workspace crates, then [dev/build] ones (`cargo metadata --no-deps`)."""
import json, os, re, subprocess, sys

root = sys.argv[1] if len(sys.argv) > 1 else "."
meta = json.loads(subprocess.check_output(
    ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"], cwd=root))
rows = []
for pkg in meta["packages"]:
    folder = os.path.dirname(pkg["manifest_path"])
    rel = os.path.relpath(folder, os.path.abspath(root))
    files = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in ("target",) and not d.startswith(".")]
        for name in filenames:
            if name.endswith(".rs"):
                files.append(os.path.join(dirpath, name))
    # Files that a `#[cfg(test)] mod NAME;` names are test files.
    test_files = set()
    for path in files:
        text = open(path, encoding="utf-8", errors="replace").read()
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+(\w+)\s*;", text):
            base = os.path.dirname(path)
            stem = os.path.splitext(os.path.basename(path))[0]
            owner = base if stem in ("mod", "lib", "main") else os.path.join(base, stem)
            for cand in (os.path.join(owner, m.group(1) + ".rs"), os.path.join(owner, m.group(1), "mod.rs")):
                test_files.add(os.path.normpath(cand))
    src = tests = blocks = ufn = uimpl = 0
    for path in sorted(files):
        r = os.path.relpath(path, folder)
        whole_test = (r.split(os.sep)[0] in ("tests", "examples", "benches")
                      or os.path.normpath(path) in test_files)
        depth = 0          # brace depth inside a #[cfg(test)] module
        pending = False    # saw #[cfg(test)], waiting for `mod x {`
        in_block_comment = False
        for line in open(path, encoding="utf-8", errors="replace"):
            s = line.strip()
            if in_block_comment:
                if "*/" in s:
                    in_block_comment = False
                continue
            if s.startswith("/*"):
                if "*/" not in s:
                    in_block_comment = True
                continue
            if not s or s.startswith("//"):
                continue
            code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', s)
            code = code.split("//")[0]
            is_test = whole_test or depth > 0
            if not whole_test and depth == 0:
                if s.startswith("#[cfg(test)]"):
                    pending = True
                    is_test = True
                elif pending:
                    is_test = True
                    if re.match(r"(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code):
                        depth = code.count("{") - code.count("}")
                        pending = False
                    elif not s.startswith("#["):
                        pending = False
                        is_test = False
            elif depth > 0:
                depth += code.count("{") - code.count("}")
            if is_test:
                tests += 1
            else:
                src += 1
            blocks += len(re.findall(r"\bunsafe\s*\{", code))
            ufn += len(re.findall(r"\bunsafe\s+(?:extern\s+\"[^\"]*\"\s+|extern\s+\"\"\s+)?fn\b", code))
            uimpl += len(re.findall(r"\bunsafe\s+impl\b", code))
    rows.append((pkg["name"], rel, src, tests, blocks, ufn, uimpl))
rows.sort()
print("| crate (folder) | src | tests | total | unsafe blocks | unsafe fn | unsafe impl |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
tot = [0] * 5
for name, rel, s, t, b, f, i in rows:
    print(f"| {name} ({rel}/) | {s} | {t} | {s+t} | {b} | {f} | {i} |")
    for k, v in enumerate((s, t, b, f, i)):
        tot[k] += v
print(f"| **total** | {tot[0]} | {tot[1]} | {tot[0]+tot[1]} | {tot[2]} | {tot[3]} | {tot[4]} |")
print()
ours = {p["name"] for p in meta["packages"]}
width = max(len(n) for n in ours) + 2
for pkg in sorted(meta["packages"], key=lambda p: p["name"]):
    normal = sorted({d["name"] for d in pkg["dependencies"] if d["name"] in ours and d["kind"] is None})
    other = sorted({d["name"] for d in pkg["dependencies"] if d["name"] in ours and d["kind"] is not None})
    line = f"{pkg['name']:<{width}} " + (", ".join(normal) or "-")
    if other:
        line += "   [dev/build: " + ", ".join(other) + "]"
    print(line.rstrip())

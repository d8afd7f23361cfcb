#!/usr/bin/env python3
"""Judges one `vgpu-ldconfig prepare --json` run of the GPU suite's `image` section and
prints the record fragment ('"verdict": ..., "figure": ..., ...') for run.sh's `record`.

    image_check.py prepare|rerun OUTCOME.json EXPECTED_VERSION RC SECONDS

PASS when the command succeeded, prepared the expected driver version (the one
nvidia-smi reports), copied libcuda and libnvidia-ml of that version and nvidia-smi,
deployed both shims, and every export check found nothing missing; for `rerun` also
when it rewrote nothing.
"""

import json
import sys


def fragment(verdict, figure, **extra):
    fields = {"verdict": verdict, "figure": figure}
    fields.update(extra)
    return ", ".join(f"{json.dumps(key)}: {json.dumps(value)}" for key, value in fields.items())


def prepare(path, expected, rc, seconds, rerun=False):
    try:
        with open(path) as handle:
            outcome = json.load(handle)
    except (OSError, ValueError):
        # The command's own words, from the .err file beside the outcome.
        try:
            with open(path.rsplit(".", 1)[0] + ".err") as handle:
                said = " | ".join(line.strip() for line in handle.readlines()[:3])
        except OSError:
            said = "no stderr"
        return fragment("FAIL", f"prepare rc {rc}: {said}", rc=rc, seconds=seconds)
    manifest = outcome.get("manifest", {})
    version = manifest.get("version", "")
    files = {entry.get("path", ""): entry.get("source", "") for entry in manifest.get("files", [])}
    checks = outcome.get("checks", [])
    missing = {check.get("shim", "?"): check.get("missing", []) for check in checks}
    wanted = [
        f"lib64/libcuda.so.{version}",
        f"lib64/libnvidia-ml.so.{version}",
        "bin/nvidia-smi",
        "shim/libcuda_shim.so",
        "shim/libnvml_shim.so",
    ]
    absent = [name for name in wanted if name not in files]
    problems = []
    if rc != 0:
        problems.append(f"rc {rc}")
    if expected and version != expected:
        problems.append(f"version {version}, nvidia-smi says {expected}")
    if absent:
        problems.append("not prepared: " + ", ".join(absent))
    if len(checks) != 2:
        problems.append(f"{len(checks)} export checks, expected 2")
    if rerun and outcome.get("changed"):
        problems.append("a re-run rewrote " + ", ".join(outcome["changed"][:5]))
    lacking = {shim: names for shim, names in missing.items() if names}
    if lacking:
        problems.append("shim lacks " + "; ".join(f"{len(n)} of {s}" for s, n in lacking.items()))
    libraries = sorted(name for name in files if name.startswith("lib64/"))
    figure = (
        f"driver {version}: {len(libraries)} libraries, nvidia-smi from "
        f"{files.get('bin/nvidia-smi', 'nowhere')}, exports complete, {seconds}s"
        if not problems
        else "; ".join(problems)
    )
    return fragment(
        "PASS" if not problems else "FAIL",
        figure,
        rc=rc,
        seconds=seconds,
        version=version,
        libcuda_from=files.get(f"lib64/libcuda.so.{version}", ""),
        libraries=libraries,
        changed=len(outcome.get("changed", [])),
        missing_exports={shim: names[:20] for shim, names in lacking.items()},
    )


def main(argv):
    if len(argv) == 6 and argv[1] in ("prepare", "rerun"):
        rc = int(argv[4]) if argv[4].lstrip("-").isdigit() else -1
        print(prepare(argv[2], argv[3], rc, argv[5], rerun=argv[1] == "rerun"))
        return 0
    print(fragment("FAIL", "image_check.py: bad arguments " + " ".join(argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

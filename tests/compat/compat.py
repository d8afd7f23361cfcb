"""The CUDA version compatibility matrix (issue 7): runs `workload.py` once per CUDA
runtime or framework under `vgpu run --memory 4GiB --cores 50`, plus once bare (no
vgpu) for the kernel-throughput reference, judges every cell, and writes the matrix.

Owns the row list (cudart wheels found in a folder, the frameworks), the time budget,
the outside view of the card while a row holds its peak, and the verdicts. Output:
OUT/compat.json, OUT/compat.md (paste into docs/compatibility.md), OUT/compat/<row>.*.txt
(raw), and the matrix on stdout.

Usage: compat.py --prefix PREFIX --out OUT [--simulate] [--rows ROW ...] [--wheels DIR]
Every run is under a timeout and in its own process group; a failing row never stops
the others, and the whole script keeps to --budget seconds.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(HERE, "workload.py")
QUOTA_BYTES = 4 << 30
QUOTA_MIB = 4096
CORES = 50
# The card's own count for a process may pass the quota by memory the driver takes
# outside every counted call (module code, local memory, internal buffers).
OUTSIDE_SLACK_MIB = 128
# `--cores 50` holds when the throughput under the shim is this share of the bare run's.
LIMIT_LOW, LIMIT_HIGH = 0.35, 0.65
# Kernels shorter than this leave the GPU idle between launches: no busy-time judgement.
MIN_KERNEL_MS = 0.05
COLUMNS = [("quota", "quota reported"), ("oom", "OOM enforced"), ("limit", "limit held"), ("smi", "nvidia-smi virtual")]
FRAMEWORK_ROWS = ["cuda-bindings", "torch", "cupy", "jax", "numba", "nvidia-ml-py"]
SIM_ROWS = ["cuda-bindings", "nvidia-ml-py"]
ROW_ENV = {
    # No preallocation, and the BFC limit at the whole reported total, so the quota (not
    # XLA's 75 % default) is what refuses; memory_stats' bytes_limit / 1.0 is the total.
    # (JAX 0.11 reads XLA_CLIENT_MEM_FRACTION and refuses to start when the deprecated
    # XLA_PYTHON_CLIENT_MEM_FRACTION is set beside it: seen on the H200.)
    "jax": {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_CLIENT_MEM_FRACTION": "1.0",
            "TF_CPP_MIN_LOG_LEVEL": "1"},
}


def cell(status, note=""):
    return {"status": status, "note": note}


# ---- verdicts -----------------------------------------------------------------------

def judge_quota(shim):
    quota = shim.get("quota")
    if not isinstance(quota, dict):
        return cell("FAIL", "the process ended before the quota query")
    if "na" in quota:
        return cell("n/a", quota["na"])
    if "error" in quota:
        return cell("FAIL", quota["error"])
    total, source = quota["total"], quota.get("source", "?")
    tolerance = (1 << 20) if "bytes_limit" in source else 0
    if abs(total - QUOTA_BYTES) <= tolerance:
        return cell("PASS", f"{source}: total {total} B, free {quota['free'] >> 20} MiB")
    return cell("FAIL", f"{source} reports total {total} B ({total / (1 << 20):.0f} MiB), not {QUOTA_BYTES}")


def judge_oom(shim, outside_mib):
    memory = shim.get("memory")
    if not isinstance(memory, dict):
        return cell("FAIL", "the process ended before the allocation phase")
    if "na" in memory and "first" not in memory:
        return cell("n/a", memory["na"])
    if "first" not in memory:
        return cell("FAIL", memory.get("error", "no allocation was made"))
    first = memory["first"]["result"]
    if first != "ok":
        return cell("FAIL", f"the first 3 GiB allocation was refused: {first}")
    steps = memory.get("steps", [])
    held_mib = memory.get("held_bytes", 0) >> 20
    if not memory.get("refused"):
        why = memory.get("error", f"{len(steps)} steps of 256 MiB all fit")
        return cell("FAIL", f"no refusal: {why}; held {held_mib} MiB")
    if memory["held_bytes"] > QUOTA_BYTES:
        return cell("FAIL", f"held {held_mib} MiB, past the {QUOTA_MIB} MiB quota")
    refusal = steps[-1]
    if not refusal.startswith("OOM"):
        return cell("FAIL", f"refused, but not as out of memory: {refusal}")
    again = memory.get("again", "")
    if not again.startswith("OOM"):
        return cell("FAIL", f"one more 256 MiB after the refusal: {again}")
    if outside_mib is not None and outside_mib > QUOTA_MIB + OUTSIDE_SLACK_MIB:
        return cell("FAIL", f"the card counts {outside_mib} MiB for the process at its peak, past the quota by more than {OUTSIDE_SLACK_MIB} MiB")
    if "error" in memory:
        return cell("FAIL", f"after the refusal: {memory['error']}")
    realloc = memory.get("realloc")
    if realloc != "ok":
        return cell("FAIL", f"after freeing everything, 3 GiB again: {realloc}")
    note = f"refused after {held_mib} MiB held ({refusal[5:]})"
    if outside_mib is not None:
        note += f"; the card counts {outside_mib} MiB for the process"
    return cell("PASS", note)


def judge_limit(shim, bare):
    launch = shim.get("launch")
    if not isinstance(launch, dict):
        return cell("FAIL", "the kernel loop did not finish")
    if "na" in launch:
        return cell("n/a", launch["na"])
    reference = (bare or {}).get("launch")
    if "error" in launch:
        if isinstance(reference, dict) and reference.get("error") == launch["error"]:
            # The framework cannot launch on this machine even without the shim.
            return cell("n/a", f"the framework fails the same way without the shim: {launch['error']}")
        return cell("FAIL", f"kernels under the shim: {launch['error']}")
    if not isinstance(reference, dict) or "rate" not in reference:
        why = (reference.get("error") or reference.get("na")) if isinstance(reference, dict) else "the bare run gave no result"
        return cell("n/a", f"no bare reference to compare with: {why}")
    if reference["per_kernel_ms"] < MIN_KERNEL_MS or reference["count"] < 20:
        return cell("n/a", f"bare kernels too short to judge busy time ({reference['per_kernel_ms']:.3f} ms, {reference['count']} in the loop)")
    ratio = launch["rate"] / reference["rate"]
    note = f"{ratio:.2f} of the bare throughput ({launch['rate']:.0f} vs {reference['rate']:.0f} kernels/s, {reference['per_kernel_ms']:.2f} ms each bare)"
    if LIMIT_LOW <= ratio <= LIMIT_HIGH:
        return cell("PASS", note)
    return cell("FAIL", note + (": not throttled to 50 %" if ratio > LIMIT_HIGH else ": throttled below 50 %"))


def judge_smi(shim):
    smi = shim.get("smi")
    if not isinstance(smi, dict):
        return cell("FAIL", "the process ended before nvidia-smi ran")
    if "na" in smi:
        return cell("n/a", smi["na"])
    if "error" in smi:
        return cell("FAIL", smi["error"])
    first = smi.get("stdout", "").splitlines()[0] if smi.get("stdout") else ""
    if smi.get("rc") != 0 or not first:
        return cell("FAIL", f"{smi.get('command')} exited {smi.get('rc')}: {smi.get('stderr') or smi.get('stdout')}")
    total = first.split(",")[0].strip()
    if total == str(QUOTA_MIB):
        return cell("PASS", f"memory.total,memory.used = {first}")
    return cell("FAIL", f"memory.total reads {total}, not {QUOTA_MIB} ({first})")


def judge_row(shim, bare, outside_mib, shim_run):
    """The four cells of one row from the workload's results and how its run ended."""
    init = shim.get("init")
    if init is None:
        cause = f"no result from the process ({shim_run}); see the row's .shim.txt"
        return {key: cell("FAIL", cause) for key, _ in COLUMNS}
    if isinstance(init, dict):
        status, text = ("n/a", init["na"]) if "na" in init else ("FAIL", f"initialization: {init.get('error')}")
        return {key: cell(status, text) for key, _ in COLUMNS}
    cells = {"quota": judge_quota(shim), "oom": judge_oom(shim, outside_mib), "limit": judge_limit(shim, bare), "smi": judge_smi(shim)}
    if shim_run != "exit 0":
        for value in cells.values():
            if value["status"] != "PASS":
                value["note"] += f" (the run ended with {shim_run})"
    return cells


# ---- running ------------------------------------------------------------------------

def last_result(text):
    for line in reversed(text.splitlines()):
        if line.startswith("RESULT "):
            try:
                return json.loads(line[len("RESULT "):])
            except json.JSONDecodeError:
                return {}
    return {}


def host_pid(ns_pid, ancestor):
    """The host PID of `ancestor`'s descendant that is `ns_pid` in its own PID namespace
    (`vgpu run` gives its command a new one, so the PID a client writes is its own), or
    `ns_pid` itself when there is none."""
    def parent(pid):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            return int(stat[stat.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            return 0

    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = open(f"/proc/{entry}/status").read()
        except OSError:
            continue
        levels = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
        pid = int(entry)
        if levels and levels[-1] == str(ns_pid):
            while pid > 1 and pid != ancestor:
                pid = parent(pid)
            if pid == ancestor:
                return int(entry)
    return ns_pid


def kill_group(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_logged(argv, env, log_path, timeout, hold=None):
    """Runs argv in its own process group with its output in log_path. `hold`, if given,
    is (marker, release, on_peak): when the marker appears, on_peak(pid) runs and then the
    release file is written. Returns (how it ended, RESULT json, what on_peak returned)."""
    peak = None
    with open(log_path, "w") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        if hold:
            marker, release, on_peak = hold
            while time.monotonic() < deadline and process.poll() is None and not os.path.exists(marker):
                time.sleep(0.05)
            if os.path.exists(marker):
                try:
                    with open(marker) as f:
                        peak = on_peak(host_pid(int(f.read().strip()), process.pid))
                finally:
                    open(release, "w").close()
        try:
            rc = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            ended = f"exit {rc}"
        except subprocess.TimeoutExpired:
            kill_group(process)
            process.wait()
            ended = f"timeout after {timeout:.0f} s"
        kill_group(process)  # leftovers of the row, if any
    with open(log_path, errors="replace") as f:
        return ended, last_result(f.read()), peak


class Matrix:
    def __init__(self, args):
        self.args = args
        self.vgpu = os.path.join(args.prefix, "bin", "vgpu")
        self.raw = os.path.join(args.out, "compat")
        os.makedirs(self.raw, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="vgpu-compat.")
        self.started = time.monotonic()
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        if args.simulate:
            self.sim_lib = os.path.join(args.prefix, "sim", "lib64")
            self.env.setdefault("COMPAT_SMI", f"{self.vgpu} smi")
        self.rows = []

    def remaining(self):
        return self.args.budget - (time.monotonic() - self.started)

    def cudart_rows(self):
        """One row per cudart wheel in the wheel folder, unpacked into the work folder."""
        rows = []
        folder = self.args.wheels
        if not folder or not os.path.isdir(folder):
            return rows
        wheels = []
        for name in os.listdir(folder):
            match = re.match(r"nvidia_cuda_runtime(?:_cu\d+)?-([0-9.]+)-.*\.whl$", name)
            if match:
                wheels.append((tuple(int(part) for part in match.group(1).split(".") if part), match.group(1), name))
        for _, version, name in sorted(wheels):
            target = os.path.join(self.work, f"cudart-{version}")
            try:
                with zipfile.ZipFile(os.path.join(folder, name)) as wheel:
                    wheel.extractall(target)
            except (zipfile.BadZipFile, OSError) as error:
                rows.append({"row": f"cudart {version}", "client": None, "error": f"{name}: {error}"})
                continue
            libs = sorted(os.path.join(d, f) for d, _, files in os.walk(target) for f in files if re.match(r"libcudart\.so\.\d+", f))
            if libs:
                rows.append({"row": f"cudart {version}", "client": f"cudart:{libs[0]}", "wheel": name})
            else:
                rows.append({"row": f"cudart {version}", "client": None, "error": f"{name} holds no libcudart.so.N"})
        return rows

    def planned_rows(self):
        if self.args.rows:
            wanted = self.args.rows
        else:
            wanted = (["cudart"] if not self.args.simulate else []) + (SIM_ROWS if self.args.simulate else FRAMEWORK_ROWS)
        rows = []
        for name in wanted:
            if name == "cudart":
                found = self.cudart_rows()
                rows += found or [{"row": "cudart", "client": None, "na": f"no nvidia_cuda_runtime*.whl in {self.args.wheels}"}]
            elif name.startswith("cudart:"):
                rows.append({"row": f"cudart {os.path.basename(name)}", "client": name})
            else:
                rows.append({"row": name, "client": name})
        return rows

    def row_env(self, client, bare):
        env = dict(self.env)
        env.update(ROW_ENV.get(client, {}))
        if bare and self.args.simulate:
            env["LD_LIBRARY_PATH"] = self.sim_lib + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        return env

    def outside_mib(self, pid):
        """What the card itself counts for `pid` (outside the namespace): the host's
        nvidia-smi, or on the sim `vgpu smi` over the bare simulated NVML."""
        query = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        env = dict(self.env)
        if self.args.simulate:
            argv = [self.vgpu, "smi"] + query
            env["LD_LIBRARY_PATH"] = self.sim_lib
        else:
            smi = shutil.which("nvidia-smi", path=env.get("PATH", "") + ":/usr/local/nvidia/bin")
            if not smi:
                return None
            argv = [smi] + query
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=15)
        except (OSError, subprocess.TimeoutExpired):
            return None
        for line in done.stdout.splitlines():
            fields = [f.strip() for f in line.split(",")]
            if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
                return int(fields[1])
        return None

    def run_row(self, row):
        name, client = row["row"], row["client"]
        slug = re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-")
        timing = ["--warm", str(self.args.warm), "--measure", str(self.args.measure)]
        result = {"row": name, "client": client}
        if client is None:
            status, text = ("n/a", row["na"]) if "na" in row else ("FAIL", row["error"])
            result["cells"] = {key: cell(status, text) for key, _ in COLUMNS}
            return result
        if self.remaining() < 15:
            result["cells"] = {key: cell("n/a", f"not run: the script's {self.args.budget:.0f} s budget was spent") for key, _ in COLUMNS}
            return result
        bare = None
        if client != "nvidia-ml-py":
            limit = min(self.args.bare_timeout, self.remaining() - 10)
            ended, bare, _ = run_logged([sys.executable, WORKLOAD, client, "--phase", "launch"] + timing,
                                        self.row_env(client, bare=True), os.path.join(self.raw, f"{slug}.bare.txt"), limit)
            result["bare_run"] = ended
        marker = os.path.join(self.work, f"{slug}.peak")
        release = os.path.join(self.work, f"{slug}.release")
        simulate = ["--simulate"] if self.args.simulate else []
        argv = [self.vgpu, "run"] + simulate + ["--memory", "4GiB", "--cores", str(CORES), "--",
                                                sys.executable, WORKLOAD, client, "--hold-marker", marker, "--release", release] + timing
        limit = max(5.0, min(self.args.row_timeout, self.remaining() - 3))
        ended, shim, outside = run_logged(argv, self.row_env(client, bare=False), os.path.join(self.raw, f"{slug}.shim.txt"),
                                          limit, hold=(marker, release, self.outside_mib))
        result.update(shim_run=ended, outside_mib=outside, versions=shim.get("versions", (bare or {}).get("versions")),
                      shim=shim, bare=bare)
        result["cells"] = judge_row(shim, bare, outside, ended)
        return result

    def run(self):
        for row in self.planned_rows():
            started = time.monotonic()
            result = self.run_row(row)
            result["seconds"] = round(time.monotonic() - started, 1)
            self.rows.append(result)
            summary = " ".join(f"{key}={result['cells'][key]['status']}" for key, _ in COLUMNS)
            print(f"row {result['row']}: {summary} ({result['seconds']} s)", flush=True)
        shutil.rmtree(self.work, ignore_errors=True)


# ---- output -------------------------------------------------------------------------

def versions_text(versions):
    if not isinstance(versions, dict) or "error" in versions or "na" in versions:
        return ""
    return ", ".join(f"{k} {v}" for k, v in versions.items() if k != "library")


def render_markdown(report):
    """The table and its footnotes; docs/compatibility.md takes it as is."""
    lines = [f"Measured {report['date']} on {report['device']}, driver {report['driver']}, "
             f"`vgpu run{' --simulate' if report['simulate'] else ''} --memory 4GiB --cores {CORES}`.", "",
             "| runtime / framework | versions | " + " | ".join(title for _, title in COLUMNS) + " |",
             "| --- | --- |" + " --- |" * len(COLUMNS)]
    notes = []
    for row in report["rows"]:
        cells = []
        for key, _ in COLUMNS:
            value = row["cells"][key]
            if value["status"] == "PASS":
                cells.append("PASS")
                continue
            # One footnote per distinct cause in a row (a failed start fails every cell).
            text = f"{row['row']}: {value['note']}"
            if text not in notes:
                notes.append(text)
            cells.append(f"{value['status']} [{notes.index(text) + 1}]")
        lines.append(f"| {row['row']} | {versions_text(row.get('versions'))} | " + " | ".join(cells) + " |")
    if notes:
        lines += [""] + [f"[{i}] {text.replace('|', '/')}" + "  " for i, text in enumerate(notes, 1)]
    details = [f"* {row['row']}: " + "; ".join(f"{key}: {row['cells'][key]['note']}" for key, _ in COLUMNS if row["cells"][key]["status"] == "PASS" and row["cells"][key]["note"])
               for row in report["rows"]]
    details = [d for d in details if not d.endswith(": ")]
    if details:
        lines += ["", "Measured values of the passing cells:", ""] + [d.replace("|", "/") for d in details]
    return "\n".join(lines) + "\n"


def render_text(report):
    header = ["row"] + [title for _, title in COLUMNS]
    table = [header] + [[row["row"]] + [row["cells"][key]["status"] for key, _ in COLUMNS] for row in report["rows"]]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(line, widths)) for line in table)


def driver_of(args):
    if args.simulate:
        return "simulated", "vgpu-sim (simulated driver)"
    smi = shutil.which("nvidia-smi", path=os.environ.get("PATH", "") + ":/usr/local/nvidia/bin")
    if not smi:
        return "unknown (no nvidia-smi)", "unknown"
    try:
        done = subprocess.run([smi, "--query-gpu=driver_version,name", "--format=csv,noheader"], capture_output=True, text=True, timeout=15)
        driver, _, name = done.stdout.splitlines()[0].partition(",")
        return driver.strip(), name.strip()
    except (OSError, IndexError, subprocess.TimeoutExpired):
        return "unknown", "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", required=True, help="a `vgpu install --prefix` folder")
    parser.add_argument("--out", required=True)
    parser.add_argument("--simulate", action="store_true", help="the sim driver: rows that need no GPU")
    parser.add_argument("--rows", nargs="*", help=f"cudart, cudart:PATH, {' '.join(FRAMEWORK_ROWS)}")
    parser.add_argument("--wheels", default=os.path.join(HERE, "..", "..", ".whl"))
    parser.add_argument("--budget", type=float, default=225)
    parser.add_argument("--row-timeout", type=float, default=40)
    parser.add_argument("--bare-timeout", type=float, default=25)
    parser.add_argument("--warm", type=float, default=0.5)
    parser.add_argument("--measure", type=float, default=2.0)
    args = parser.parse_args()
    if not os.access(os.path.join(args.prefix, "bin", "vgpu"), os.X_OK):
        parser.error(f"{args.prefix}/bin/vgpu is missing: run `vgpu install --prefix {args.prefix}`")
    driver, device = driver_of(args)
    matrix = Matrix(args)
    matrix.run()
    report = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "driver": driver, "device": device,
              "simulate": args.simulate, "quota": {"memory": "4GiB", "cores": CORES}, "rows": matrix.rows}
    with open(os.path.join(args.out, "compat.json"), "w") as f:
        json.dump(report, f, indent=1)
    markdown = render_markdown(report)
    with open(os.path.join(args.out, "compat.md"), "w") as f:
        f.write(markdown)
    print(render_text(report))
    print(f"wrote {args.out}/compat.json and {args.out}/compat.md")


if __name__ == "__main__":
    main()

"""Prints the GPU suite's table from results.jsonl: one row per check, with the figure
and a verdict against the issue's target. A record with `verdict` and `figure` keys is
printed as it is; the older sections' records are judged here."""
import json, sys

GIB = 1 << 30
rows = []

def verdict(ok):
    return "PASS" if ok else "FAIL"

for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    try:
        r = json.loads(line)
    except json.JSONDecodeError as e:
        rows.append(("?", line[:40], f"unparsable: {e}", "FAIL"))
        continue
    s, n, res = r["section"], r["name"], r.get("result", {})
    if "skipped" in r:
        rows.append((s, n, r["skipped"], "SKIP"))
    elif "verdict" in r:
        # A section that judges its own check records `verdict` (PASS, FAIL or SKIP) and
        # a one-line `figure`; new sections do this, so this file needs no case for them.
        rows.append((s, n, str(r.get("figure", ""))[:110], r["verdict"]))
    elif s == "forward" and n == "frameworks":
        ok = r.get("rc") == 0 and all(res.get(k) is True for k in ("torch_matmul", "torch_bf16", "cupy_sum", "jax_dot"))
        rows.append((s, n, json.dumps(res)[:70], verdict(ok)))
    elif s == "forward" and n == "nvidia-smi":
        ok = r["rc"] == 0 and r["rc_q"] == 0 and r["function_not_found"] == 0 and r["q_lines_differing"] == 0
        rows.append((s, n, f"rc={r['rc']}/{r['rc_q']} FNF={r['function_not_found']} -q diff lines={r['q_lines_differing']}", verdict(ok)))
    elif s == "forward" and n == "bench":
        if "error" in r:
            rows.append((s, n, r["error"], "FAIL"))
            continue
        launch = r["launch_us_shim"] / r["launch_us_bare"]
        launch_q = r["launch_us_shim_quota"] / r["launch_us_bare"]
        matmul = r["matmul_tflops_shim"] / r["matmul_tflops_bare"]
        added = r["alloc_pair_us_shim"] - r["alloc_pair_us_bare"]
        rows.append((s, "launch (no quota)", f"{r['launch_us_bare']:.3f} -> {r['launch_us_shim']:.3f} us ({launch:.3f}x)", verdict(launch <= 1.02)))
        rows.append((s, "launch (memory quota)", f"{r['launch_us_shim_quota']:.3f} us ({launch_q:.3f}x)", verdict(launch_q <= 1.02)))
        rows.append((s, "matmul bf16 8192^3", f"{r['matmul_tflops_bare']:.0f} -> {r['matmul_tflops_shim']:.0f} TFLOP/s ({matmul:.3f}x)", verdict(matmul >= 0.98)))  # forwarding can only cost: faster through the shim is the card's clocks (run 11: 1.020x)
        rows.append((s, "alloc+free pair", f"{r['alloc_pair_us_bare']:.3f} -> {r['alloc_pair_us_shim']:.3f} us (+{added:.3f})", verdict(added <= 1.0)))
    elif s == "quota" and n.startswith(("torch", "cupy")):
        outside = r.get("outside_mib")
        ok = r["rc"] == 0 and res.get("total") == 4 * GIB and res.get("fit_3g") and res.get("oom_2g") and outside is not None and outside <= 4096 + 1024
        rows.append((s, n, f"total={res.get('total', 0) / GIB:.2f}GiB 3G fits={res.get('fit_3g')} +2G OOM={res.get('oom_2g')} outside={outside}MiB", verdict(ok)))
    elif s == "quota" and n == "jax":
        limit = res.get("bytes_limit") or 0
        outside = r.get("outside_mib")
        ok = r["rc"] == 0 and 0.70 * 4 * GIB <= limit <= 0.76 * 4 * GIB and outside is not None and outside <= 4096 + 1024
        rows.append((s, n, f"bytes_limit={limit / GIB:.2f}GiB ({limit / (4 * GIB):.0%} of quota) outside={outside}MiB", verdict(ok)))
    elif s == "quota" and n.startswith("probe"):
        allocs = [a["result"] for a in res.get("allocations", [])]
        info = res.get("mem_get_info") or [0, 0]
        nvml_total = ((res.get("nvml") or {}).get("memory") or [[0]])[0][0]
        ok = r["rc"] == 0 and allocs == ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"] and info[1] == 4 * GIB and nvml_total == 4 * GIB
        rows.append((s, n, f"3GiB,2GiB -> {allocs}; total={info[1] / GIB:.2f}GiB free={info[0] / GIB:.2f}GiB; NVML after CUDA total={nvml_total / GIB:.2f}GiB", verdict(ok)))
    elif s == "quota" and n == "procaddress-map":
        ok = r["rc"] == 0 and res.get("checked", 0) > 0 and not res.get("escapes")
        rows.append((s, n, f"{res.get('checked')} lookups of {res.get('hooked')} hooks' names; escapes={res.get('escapes')}", verdict(ok)))
    elif s == "nvml":
        p = r.get("pynvml", {})
        used = p.get("used", 0) / GIB
        ok = r["rc"] == 0 and r["function_not_found"] == 0 and r["smi_shows_4096"] >= 1 and p.get("total") == 4 * GIB and 1.0 <= used <= 2.0 and p.get("count") == 1
        rows.append((s, n, f"FNF={r['function_not_found']} smi 4096MiB rows={r['smi_shows_4096']} pynvml used={used:.2f}GiB procs={len(p.get('procs', []))} csv={r.get('csv')}", verdict(ok)))
    else:
        rows.append((s, n, json.dumps({k: v for k, v in r.items() if k not in ('section', 'name')})[:70], verdict(r.get("rc") == 0)))

width = max(len(r[1]) for r in rows) if rows else 10
print()
print(f"{'section':<8} {'check':<{width}} {'verdict':<7} figure")
for s, n, fig, v in rows:
    print(f"{s:<8} {n:<{width}} {v:<7} {fig}")
passed = sum(r[3] == "PASS" for r in rows)
failed = sum(r[3] == "FAIL" for r in rows)
print(f"{passed} passed, {failed} failed")

"""Unit tests of compat.py's verdicts: every cell can pass, fail (naming the cause) and be
n/a (naming the reason), from hand-made workload results. Run:
python3 -m unittest discover -s tests/compat -p 'test_*.py' (tests/tests/compat_sim.rs does)."""
import copy
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compat  # noqa: E402

MIB = 1 << 20
GOOD_SHIM = {
    "pid": 1, "init": "ok",
    "quota": {"free": 4032 * MIB, "total": 4 << 30, "source": "cuMemGetInfo"},
    "memory": {"first": {"size": 3 << 30, "result": "ok"}, "steps": ["ok", "ok", "ok", "OOM: CUDA_ERROR_OUT_OF_MEMORY"],
               "refused": True, "held_bytes": 3840 * MIB, "again": "OOM: CUDA_ERROR_OUT_OF_MEMORY", "realloc": "ok"},
    "smi": {"command": "nvidia-smi", "rc": 0, "stdout": "4096, 3904", "stderr": ""},
    "launch": {"kernel": "k", "count": 250, "seconds": 1.0, "rate": 250.0, "batch": 8, "per_kernel_ms": 4.0},
}
GOOD_BARE = {"init": "ok", "launch": {"kernel": "k", "count": 500, "seconds": 1.0, "rate": 500.0, "batch": 16, "per_kernel_ms": 2.0}}


def shim_with(**changes):
    shim = copy.deepcopy(GOOD_SHIM)
    for path, value in changes.items():
        target = shim
        keys = path.split("__")
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return shim


class Verdicts(unittest.TestCase):
    def statuses(self, shim, bare=GOOD_BARE, outside=3904, ended="exit 0"):
        cells = compat.judge_row(shim, bare, outside, ended)
        return {key: cells[key]["status"] for key in cells}, cells

    def test_a_good_row_passes_every_cell_with_its_figures(self):
        statuses, cells = self.statuses(GOOD_SHIM)
        self.assertEqual(statuses, {"quota": "PASS", "oom": "PASS", "limit": "PASS", "smi": "PASS"})
        self.assertIn("0.50 of the bare throughput", cells["limit"]["note"])
        self.assertIn("3904 MiB", cells["oom"]["note"])

    def test_a_card_sized_total_fails_the_quota_cell(self):
        _, cells = self.statuses(shim_with(quota__total=80 << 30))
        self.assertEqual(cells["quota"]["status"], "FAIL")
        self.assertIn("81920 MiB", cells["quota"]["note"])

    def test_jax_limit_within_a_mebibyte_passes(self):
        shim = shim_with(quota__total=(4 << 30) - 4096, quota__source="memory_stats bytes_limit / 1.0")
        self.assertEqual(compat.judge_quota(shim)["status"], "PASS")
        self.assertEqual(compat.judge_quota(shim_with(quota__total=(4 << 30) - 4096))["status"], "FAIL")

    def test_no_refusal_or_too_much_held_fails_the_oom_cell(self):
        no_refusal = shim_with(memory__refused=False, memory__steps=["ok"] * 32, memory__held_bytes=11 << 30)
        self.assertIn("no refusal", compat.judge_oom(no_refusal, None)["note"])
        past = shim_with(memory__held_bytes=(4 << 30) + MIB)
        self.assertIn("past the 4096 MiB quota", compat.judge_oom(past, None)["note"])
        again = shim_with(memory__again="ok")
        self.assertIn("one more 256 MiB", compat.judge_oom(again, None)["note"])
        wrong_error = shim_with(memory__steps=["ok", "error: CUDA_ERROR_INVALID_VALUE"])
        self.assertEqual(compat.judge_oom(wrong_error, None)["status"], "FAIL")
        first = shim_with(memory__first={"size": 3 << 30, "result": "OOM: cudaErrorMemoryAllocation"})
        self.assertIn("first 3 GiB", compat.judge_oom(first, None)["note"])
        realloc = shim_with(memory__realloc="OOM: torch.OutOfMemoryError")
        self.assertIn("after freeing", compat.judge_oom(realloc, None)["note"])

    def test_the_cards_own_count_past_the_slack_fails(self):
        self.assertEqual(compat.judge_oom(GOOD_SHIM, 4096 + compat.OUTSIDE_SLACK_MIB)["status"], "PASS")
        verdict = compat.judge_oom(GOOD_SHIM, 4096 + compat.OUTSIDE_SLACK_MIB + 1)
        self.assertEqual(verdict["status"], "FAIL")
        self.assertIn("the card counts", verdict["note"])

    def test_an_unthrottled_or_overthrottled_loop_fails_the_limit_cell(self):
        fast = shim_with(launch__rate=480.0)
        verdict = compat.judge_limit(fast, GOOD_BARE)
        self.assertEqual(verdict["status"], "FAIL")
        self.assertIn("not throttled", verdict["note"])
        slow = shim_with(launch__rate=50.0)
        self.assertIn("below 50 %", compat.judge_limit(slow, GOOD_BARE)["note"])

    def test_the_limit_cell_is_na_without_a_usable_reference(self):
        self.assertEqual(compat.judge_limit(GOOD_SHIM, None)["status"], "n/a")
        self.assertEqual(compat.judge_limit(GOOD_SHIM, {"init": "ok", "launch": {"error": "x"}})["status"], "n/a")
        tiny = {"launch": dict(GOOD_BARE["launch"], per_kernel_ms=0.01, count=100000)}
        verdict = compat.judge_limit(GOOD_SHIM, tiny)
        self.assertEqual(verdict["status"], "n/a")
        self.assertIn("too short", verdict["note"])
        self.assertEqual(compat.judge_limit(shim_with(launch={"error": "cuLaunchKernel: CUDA_ERROR_LAUNCH_FAILED"}), GOOD_BARE)["status"], "FAIL")

    def test_smi_must_read_the_quota(self):
        self.assertEqual(compat.judge_smi(shim_with(smi__stdout="81559, 500"))["status"], "FAIL")
        self.assertEqual(compat.judge_smi(shim_with(smi__rc=9, smi__stderr="NVML: Function Not Found"))["status"], "FAIL")
        self.assertEqual(compat.judge_smi(shim_with(smi={"na": "nvidia-smi is not installed"}))["status"], "n/a")

    def test_a_missing_framework_is_na_and_a_dead_process_fails_every_cell(self):
        statuses, cells = self.statuses({"pid": 1, "init": {"na": "not installed: No module named 'jax'"}})
        self.assertEqual(set(statuses.values()), {"n/a"})
        statuses, cells = self.statuses({}, ended="timeout after 40 s")
        self.assertEqual(set(statuses.values()), {"FAIL"})
        self.assertIn("timeout after 40 s", cells["quota"]["note"])

    def test_a_cut_off_row_keeps_what_it_measured(self):
        shim = {key: value for key, value in GOOD_SHIM.items() if key != "launch"}
        statuses, cells = self.statuses(shim, ended="timeout after 40 s")
        self.assertEqual(statuses, {"quota": "PASS", "oom": "PASS", "limit": "FAIL", "smi": "PASS"})
        self.assertIn("timeout after 40 s", cells["limit"]["note"])

    def test_markdown_shares_one_footnote_per_cause(self):
        rows = [{"row": "jax", "versions": None, "cells": {k: compat.cell("n/a", "not installed") for k, _ in compat.COLUMNS}},
                {"row": "cuda-bindings", "versions": {"driver": 13000}, "cells": compat.judge_row(GOOD_SHIM, GOOD_BARE, 3904, "exit 0")}]
        report = {"date": "d", "driver": "580.159.04", "device": "H200", "simulate": False, "rows": rows}
        text = compat.render_markdown(report)
        self.assertIn("| jax |  | n/a [1] | n/a [1] | n/a [1] | n/a [1] |", text)
        self.assertIn("| cuda-bindings | driver 13000 | PASS | PASS | PASS | PASS |", text)
        self.assertIn("[1] jax: not installed", text)


if __name__ == "__main__":
    unittest.main()

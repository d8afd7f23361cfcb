"""Holds 1 GiB with PyTorch for argv[1] seconds (for the NVML view checks)."""
import os, sys, time, torch
t = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
t.fill_(1)
torch.cuda.synchronize()
open(sys.argv[2], "w").write(str(os.getpid()))
time.sleep(float(sys.argv[1]))

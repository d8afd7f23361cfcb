"""A batch-1 decode loop for the compute limiter's GPU section: 24 small fp16 layers
(1024 wide, as a small language model's per-token work), one token at a time, each step
synchronised (the next token needs this one).

Usage: decode.py SECONDS     one run of SECONDS (contention.sh, run_mps.sh)
       decode.py serve BASE  rounds on command from interleave.py (run_limiter.sh), over
                             the FIFOs BASE.cmd and BASE.reply (see rounds.py)
Prints RESULT {"steps_per_s", "p50_ms", "p99_ms", "max_ms", "steps", "t0", "wall_s",
"card_util"} (card_util: NVML's mean utilization meanwhile, see cardutil.py), once, or
once a round after a `ROUND CYCLE` line.
"""
import sys

import rounds

# Before the slow start-up: a coordinator that gives up on this run ends it.
server = rounds.server_of(sys.argv[1:])

import torch  # noqa: E402 (after the FIFOs: see above)

torch.backends.cuda.matmul.allow_tf32 = False
layers = []
for _ in range(24):
    layers += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
model = torch.nn.Sequential(*layers).cuda().half().eval()
x = torch.randn(1, 1024, device="cuda", dtype=torch.float16)


def step():
    y = model(x)
    y[0, 0].item()  # the next token depends on this one


with torch.inference_mode():
    for _ in range(50):
        model(x)
    torch.cuda.synchronize()
    rounds.main(step, sys.argv[1:], __doc__, server=server)

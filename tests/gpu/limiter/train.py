"""Transformer training for the compute limiter's GPU section: a 6-layer encoder
(d_model 512, 8 heads, batch 16 x 256 tokens, bf16 autocast, AdamW) after a warm-up; its
throughput under `--cores 50` should be half of the bare run's.

Usage: train.py SECONDS     one run of SECONDS (default 6)
       train.py serve BASE  rounds on command from interleave.py (run_limiter.sh), over
                            the FIFOs BASE.cmd and BASE.reply (see rounds.py)
Prints RESULT {"steps_per_s", "steps", "wall_s", "t0", "card_util"} (card_util: NVML's
mean utilization meanwhile, see cardutil.py), once, or once a round after a `ROUND
CYCLE` line. Steps are queued ahead and waited for every 4 steps and before the clock
stops.
"""
import sys

import rounds

# Before the slow start-up: a coordinator that gives up on this run ends it.
server = rounds.server_of(sys.argv[1:])

import torch  # noqa: E402 (after the FIFOs: see above)

torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 6).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(16, 256, 512, device="cuda")


def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def main():
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    rounds.main(step, sys.argv[1:], __doc__, one_shot_s=6.0, server=server,
                sync=torch.cuda.synchronize, sync_every=4, timed=False)


if __name__ == "__main__":
    main()

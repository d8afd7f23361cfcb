"""Transformer training for the compute limiter's GPU section: a 6-layer encoder
(d_model 512, 8 heads, batch 16 x 256 tokens, bf16 autocast, AdamW) for SECONDS after a
warm-up; its throughput under `--cores 50` should be half of the bare run's.

Usage: train.py SECONDS
Prints one line: RESULT {"steps_per_s", "steps", "wall_s", "card_util"} (card_util: NVML's
mean utilization meanwhile, see cardutil.py).
"""
import json
import sys
import time

import torch

from cardutil import CardUtil

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
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    card = CardUtil()
    card.start()
    start = time.perf_counter()
    steps = 0
    while time.perf_counter() - start < seconds:
        step()
        steps += 1
        if steps % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    card_util = card.stop()
    print("RESULT " + json.dumps({"steps_per_s": round(steps / wall, 3), "steps": steps, "wall_s": round(wall, 3),
                                  "card_util": card_util}))


if __name__ == "__main__":
    main()

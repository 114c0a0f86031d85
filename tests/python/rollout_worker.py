"""A rollout engine for test_publish: picks up each new version of a topic,
loads it into its own bfloat16 copy of the policy, "generates" with it, and
prints one JSON line per version: its number and the bits of what it
generated. Stops after the version given."""

import json
import sys

import torch

import ckpt.torch


def main():
    socket, topic, last = sys.argv[1], sys.argv[2], int(sys.argv[3])
    policy = torch.nn.Linear(16, 8).to(torch.bfloat16)
    sub = ckpt.torch.Subscriber(topic, socket=socket)
    prompt = torch.ones(1, 16, dtype=torch.bfloat16)
    seen = 0
    while seen < last:
        seen = sub.wait_for_version(after=seen, timeout=120)
        loaded = sub.load_into(policy, version=seen, prefix="model")
        with torch.no_grad():
            out = policy(prompt)
        print(json.dumps({"version": loaded,
                          "weight": policy.weight.view(torch.int16).flatten().tolist(),
                          "out": out.view(torch.int16).flatten().tolist()}),
              flush=True)


if __name__ == "__main__":
    main()

"""Where a toy policy's loss goes: mean per-token NLL on val-split traces, by token role.

A stalled training run (val loss on a plateau) is stuck on one sub-skill; this names it
(e.g. the check's verdict, or which operation comes next). The slip entropy (``res10``,
the tens digit of a step's result) is irreducible; every other role is learnable to ~0.

    python scripts/toy_token_loss.py checkpoints/toy-policy [more model dirs ...]

Prints, per model, the mean NLL and each role's share of it (x1000, summing to the mean).
"""

from __future__ import annotations

import argparse
import collections
import random


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--n", type=int, default=300, help="val-split traces")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data_pipelines.toy.task import char_roles, draw_question, sample_trace, split_of
    from gambit_core.prompts import build_prompt

    rng = random.Random("token-loss")
    traces = []
    while len(traces) < a.n:
        q = draw_question(rng)
        if split_of(q) == "val":
            traces.append((q, sample_trace(q, rng).text))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for path in a.models:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).to(dev).eval()
        tot: dict[str, float] = collections.defaultdict(float)
        n = 0
        for q, tr in traces:
            p = [tok.bos_token_id] + tok.encode(build_prompt(q.text, tok), add_special_tokens=False)
            enc = tok(tr, add_special_tokens=False, return_offsets_mapping=True)
            c = enc["input_ids"] + [tok.eos_token_id]
            ch = char_roles(tr)
            cs = [ch[s] for s, _ in enc["offset_mapping"]] + ["eos"]
            ids = torch.tensor([p + c], device=dev)
            with torch.no_grad():
                lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
            nll = -lp[torch.arange(len(p) - 1, ids.shape[1] - 1, device=dev), torch.tensor(c, device=dev)]
            for k, v in zip(cs, nll.tolist(), strict=True):
                tot[k] += v
            n += len(c)
        top = sorted(tot, key=lambda k: -tot[k])
        print(f"{path}  mean {sum(tot.values()) / n:.4f}  " + "  ".join(f"{k}:{tot[k] / n * 1000:.1f}" for k in top[:6]), flush=True)


if __name__ == "__main__":
    main()

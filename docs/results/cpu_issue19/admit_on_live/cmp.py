"""Compare gambit-solve runs with and without --admit-on-live, question by question.

    bash docs/results/cpu_issue19/admit_on_live/admit_cmp.sh   # writes /tmp/vc_<method>_<mode>
    .venv/bin/python docs/results/cpu_issue19/admit_on_live/cmp.py [DIR]   # DIR: /tmp by default
"""

import json
import sys


def load(d: str) -> dict:
    with open(f"{d}/results.jsonl") as f:
        return {r["id"]: r for r in map(json.loads, f)}


def main(root: str) -> None:
    for m in ["sc", "gambit"]:
        a, b = load(f"{root}/vc_{m}_admit-on-live"), load(f"{root}/vc_{m}_no-admit-on-live")
        keys = sorted(set(a) & set(b))
        diff = {f: sum(a[k].get(f) != b[k].get(f) for k in keys)
                for f in ["answer", "correct", "answer_plain", "unique_tokens", "votes"]}
        print(m, len(keys), "questions; differing:", diff,
              "correct", sum(bool(a[k]["correct"]) for k in keys),
              sum(bool(b[k]["correct"]) for k in keys),
              "tokens", sum(a[k]["unique_tokens"] for k in keys),
              sum(b[k]["unique_tokens"] for k in keys))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp")

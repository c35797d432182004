import json, sys
def load(d):
    return {r["id"]: r for r in map(json.loads, open(f"{d}/results.jsonl"))}
for m in ["sc", "gambit"]:
    try:
        a, b = load(f"/tmp/vc_{m}_admit-on-live"), load(f"/tmp/vc_{m}_no-admit-on-live")
    except FileNotFoundError as e:
        print(m, "missing", e); continue
    keys = sorted(set(a) & set(b))
    r0 = a[keys[0]]
    print(m, "fields", [k for k in r0 if not isinstance(r0[k], (dict, list))][:20])
    diff = {f: sum(a[k].get(f) != b[k].get(f) for k in keys) for f in ["answer", "correct", "unique_tokens", "votes"] if f in r0}
    print(m, len(keys), "questions; differing:", diff,
          "acc", sum(bool(a[k].get("correct")) for k in keys), sum(bool(b[k].get("correct")) for k in keys),
          "tok", sum(a[k].get("unique_tokens", 0) for k in keys), sum(b[k].get("unique_tokens", 0) for k in keys))
for d in ["sc_admit-on-live","sc_no-admit-on-live","gambit_admit-on-live","gambit_no-admit-on-live"]:
    try:
        s = json.load(open(f"/tmp/vc_{d}/summary.json")); print(d, {k: s[k] for k in s if k in ("wall_s","tokens_per_s","accuracy","search_overhead_pct")})
    except Exception as e: print(d, e)

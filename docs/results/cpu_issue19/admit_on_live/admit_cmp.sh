#!/bin/bash
cd /work/main
for m in sc gambit; do for a in admit-on-live no-admit-on-live; do
  rm -rf /tmp/vc_${m}_${a}
  .venv/bin/gambit-solve --method $m --dataset toy:val:24 --n 32 --max-live 64 --$a --out /tmp/vc_${m}_${a} > /tmp/vc_${m}_${a}.log 2>&1 || echo "fail $m $a"
done; done
echo done

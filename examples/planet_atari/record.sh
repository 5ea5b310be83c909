#!/usr/bin/env bash
# The data of the PlaNet-on-Atari study (docs/planet.md, "PlaNet on Atari"): one dataset per game and action
# repeat, recorded once with the uniform random policy, plus a held-out dataset from other env seeds, so that every
# trial of the study's sweeps (`reverie pretrain`, no env steps) learns from the same frames and is judged on the
# same unseen ones. Env: env=atari100k (sticky actions 0, up to 30 no-ops, the minimal action set, 64x64 RGB).
#
#   bash examples/planet_atari/record.sh                 # into data/planet_atari/ (git ignores data/)
#   OUT=/somewhere EPISODES_SCALE=0.1 bash examples/planet_atari/record.sh   # elsewhere; a tenth of the episodes
#
# Episodes per dataset are chosen for about 18k rows at action repeat 4 (Boxing: a random game lasts its full two
# minutes, 1,785 agent steps; Breakout: about 200) and half that at repeat 8; held-out sets are a fifth of that.
set -euo pipefail
OUT=${OUT:-data/planet_atari}
SCALE=${EPISODES_SCALE:-1}
REVERIE=${REVERIE:-reverie}
episodes() { python3 -c "import math, sys; print(max(1, math.ceil(float(sys.argv[1]) * float(sys.argv[2]))))" "$1" "$SCALE"; }
for game in boxing breakout; do
  case $game in boxing) n=10;; breakout) n=90;; esac
  for repeat in 4 8; do
    name=${game}_r${repeat}
    args=(env=atari100k env.task=$game env.action_repeat=$repeat)
    $REVERIE record --out "$OUT/$name" --episodes "$(episodes $n)" "${args[@]}" seed=0
    $REVERIE record --out "$OUT/${name}_heldout" --episodes "$(episodes $((n / 5)))" "${args[@]}" seed=1
  done
done

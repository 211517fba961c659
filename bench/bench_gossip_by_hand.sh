#!/usr/bin/env bash
# Gossip as sites run it (issue 25's "must show"), on one machine: three CURVE peers started by
# hand as docs/gossip.md's quick start says, 8 s apart; then the same three with the third
# killed (SIGKILL) mid-run and started again with --resume latest; then the killed peer's
# exported model loaded into build_model() and scored. Prints the figures:
#   - final accuracy of each peer, rounds alone, exit codes (quick start)
#   - seconds the two other peers lost after the kill (their round seconds above their median
#     before it, summed over 20 rounds), the resumed peer's run (one run, rounds 1-N)
#   - the exported model's test accuracy against the one its history records
#
#   bash bench/bench_gossip_by_hand.sh [ROUNDS]        (default 50; ~1.5 minutes)
#   KEEP=1 bash bench/bench_gossip_by_hand.sh          (keeps the work folder and its logs)
set -euo pipefail
ROUNDS=${1:-50}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/fedweave-by-hand-XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$WORK"' EXIT
cd "$WORK"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 OMP_NUM_THREADS=1
FW="python -m fedweave.cli"
$FW data split --out data --clients 3 --task digits > /dev/null
read -r P0 P1 P2 < <(python -c "from fedweave.addresses import free_ports; print(*free_ports(3))")

keys() {  # each site makes its key pair; every site allows the others' public keys
  for i in 0 1 2; do rm -rf "k$i"; $FW keys new --out "k$i" > /dev/null; done
  for i in 0 1 2; do for j in 0 1 2; do
    [ "$i" = "$j" ] || $FW keys allow "k$j/peer.key" --keys "k$i" > /dev/null
  done; done
}
peer() {  # peer I [extra args...]: site I as the quick start starts it
  local i=$1; shift
  local ports=("$P0" "$P1" "$P2") seeds=""
  [ "$i" = 0 ] || seeds="--seeds tcp://127.0.0.1:$P0"
  # exec: the background job is the peer itself, so kill -9 reaches it
  exec $FW peer --listen "tcp://127.0.0.1:${ports[$i]}" --keys "k$i" $seeds --task digits \
    --data "data/site-$i.npz" --test-data data/test.npz --rounds "$ROUNDS" --wait-for-peers 3 \
    --db "sqlite:///h$i.db" "$@"
}
summary() {
  for i in 0 1 2; do
    printf '  peer %s: %s\n' "$i" "$(grep -E "^.{24}(INFO|WARNING) fedweave.gossip: (completed|failed)" "p$i.log" | tail -1 | cut -c25-)"
    printf '          %s\n' "$(grep -E "round $ROUNDS/" "p$i.log" | tail -1 | cut -c25- | cut -d';' -f1-2)"
  done
}

echo "1. quick start by hand, peers started 8 s apart, $ROUNDS rounds"
keys
peer 0 > p0.log 2>&1 & A=$!; sleep 8
peer 1 > p1.log 2>&1 & B=$!; sleep 8
peer 2 > p2.log 2>&1 & C=$!
a=0; b=0; c=0; wait $A || a=$?; wait $B || b=$?; wait $C || c=$?
echo "  exit codes $a $b $c"; summary

KILL_AT=$((ROUNDS / 10 * 5))  # a multiple of 5: its console line is always printed
echo "2. the same, peer 2 killed (SIGKILL) at round $KILL_AT and started again with --resume latest"
rm -rf h*.db checkpoints p*.log; keys
peer 0 --round-interval 0.3 > p0.log 2>&1 & A=$!; sleep 8
peer 1 --round-interval 0.3 > p1.log 2>&1 & B=$!; sleep 8
peer 2 --round-interval 0.3 > p2.log 2>&1 & C=$!
until grep -q "round $KILL_AT/" p2.log; do sleep 0.05; done
kill -9 $C; wait $C 2>/dev/null || true; python -c "import time; print(time.time())" > killed_at
peer 2 --round-interval 0.3 --resume latest >> p2.log 2>&1 & C=$!
a=0; b=0; c=0; wait $A || a=$?; wait $B || b=$?; wait $C || c=$?
echo "  exit codes $a $b $c (peer 2: the resumed process)"; summary
grep -E "resuming run" p2.log | cut -c25- | sed 's/^/  /' || true
python - <<'EOF'
import statistics
from datetime import datetime, timezone
from fedweave.history import open_store
killed = datetime.fromtimestamp(float(open("killed_at").read()), timezone.utc)
for i in (0, 1):
    store = open_store(f"sqlite:///h{i}.db")
    rows = store.rounds(store.get_run("latest").run_id)
    before = [r["extra"]["seconds"] for r in rows if r["ended_at"] <= killed][-15:]
    after = [r["extra"]["seconds"] for r in rows if r["ended_at"] > killed][:20]
    typical = statistics.median(before)
    lost = sum(max(0.0, s - typical) for s in after)
    print(f"  peer {i}: median round {typical:.3f} s before the kill, longest after {max(after):.3f} s:"
          f" {lost:.2f} s lost over 20 rounds = {lost / 5:.3f} of one deadline (5 s)")
store = open_store("sqlite:///h2.db")
run = store.get_run("latest")
rows = store.rounds(run.run_id)
print(f"  peer 2: {len(store.list_runs())} run, {run.status}, rounds {rows[0]['round']}-{rows[-1]['round']}"
      f" ({len(rows)} rows), checkpoints at rounds {[r['round'] for r in rows if r['checkpoint_path']]}")
EOF

echo "3. peer 2's model exported, loaded into build_model() and scored"
$FW history export latest --to out --db sqlite:///h2.db > /dev/null
python - <<'EOF'
import csv
from pathlib import Path
from fedweave.config import RunConfig
from fedweave.learning.data import load_site_data
from fedweave.learning.tasks import load_task
from fedweave.learning.training import TrainConfig
from fedweave.learning.weights import load_weights_npz, set_weights
task = load_task("digits")
model = task.build_model()
set_weights(model, load_weights_npz("out/model.npz"))
test = load_site_data(Path("data/test.npz"), task)
scored = task.evaluate(model, test, TrainConfig.of(RunConfig().training))["accuracy"]
last = list(csv.DictReader(open("out/rounds.csv")))[-1]
print(f"  exported model: accuracy {scored:.4f}; its history, round {last['round']}: "
      f"{float(last['eval_accuracy']):.4f}")
EOF

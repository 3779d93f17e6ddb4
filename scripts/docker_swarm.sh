#!/usr/bin/env bash
# Bring up a gradnode swarm with docker compose (one bootstrap, PEERS peers), wait until every peer
# has finished ROUNDS rounds, check that all report the same weight hash for the same round, print
# each peer's loss, and tear everything down (volumes included).
#   PEERS=4 ROUNDS=5 PRESET=swarm-demo.yaml bash scripts/docker_swarm.sh
# CHAOS=1: a straggler (every inner step 5x slower) trains from the start; once every peer has
# finished round 2, kill -9 one peer's container, start the same container again (same key and
# checkpoints: it resumes and catches up) and add a late joiner; the check then expects PEERS+2
# peers on one hash.
# Works with `docker compose` and with `docker-compose` (v1).
set -euo pipefail
peers=${PEERS:-4} rounds=${ROUNDS:-5} preset=${PRESET:-swarm-demo.yaml} timeout=${TIMEOUT:-900} chaos=${CHAOS:-0}
project=${PROJECT:-gradnode-check}
cd "$(dirname "$0")/.."
compose() {
  if docker compose version >/dev/null 2>&1; then docker compose -f docker/compose.yaml -p "$project" "$@"
  else docker-compose -f docker/compose.yaml -p "$project" "$@"; fi
}
export GRADNODE_PRESET=$preset GRADNODE_ROUNDS=0
straggler=${project}-straggler
trap 'echo "[docker_swarm] tearing down"; docker rm -f "$straggler" >/dev/null 2>&1 || true
      compose down -v --remove-orphans >/dev/null 2>&1 || true' EXIT

# start from a clean slate: leftovers of an earlier run (containers, volumes) would fool the check
docker rm -f "$straggler" >/dev/null 2>&1 || true
compose down -v --remove-orphans >/dev/null 2>&1 || true
compose build
compose up -d --scale peer="$peers"
echo "[docker_swarm] swarm up: 1 bootstrap + $peers peers, preset $preset; waiting for $rounds rounds"

# Read every peer's metrics.jsonl from the shared volume: exit 0 when all peers passed the target
# round and agree on its hash, 1 while waiting, 2 on disagreement.
check() {
  docker run --rm -i -v "${project}_peer-data:/data:ro" --entrypoint python "gradnode:${GRADNODE_VARIANT:-cpu}" - \
    "$1" "$2" <<'PY'
import json, os, pathlib, sys, traceback
# a bug in this check must fail the run, not read as "still waiting" (exit 1)
sys.excepthook = lambda *exc: (traceback.print_exception(*exc), os._exit(3))
peers, rounds = int(sys.argv[1]), int(sys.argv[2])
rows = {}
for f in sorted(pathlib.Path("/data").glob("*/metrics.jsonl")):
    lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    rows[f.parent.name] = {r["round"]: r for r in lines}
done = {p: r for p, r in rows.items() if r and max(r) >= rounds - 1}
print(f"peers reporting={len(rows)} reached round {rounds - 1}: {len(done)}/{peers}")
if len(done) < peers:
    sys.exit(1)
# compare at the newest round every peer logged (a peer that caught up by replay or state download
# logs no row for the rounds it skipped)
common = set.intersection(*(set(r) for r in done.values()))
target = max((x for x in common if x >= rounds - 1), default=None)
if target is None:
    sys.exit(1)
hashes = {p: r[target]["hash"] for p, r in done.items()}
for p, r in sorted(done.items()):
    first, last = r[min(r)], r[target]
    print(f"  peer {p}: rounds {min(r)}..{max(r)} ({len(r)} logged)  loss {first['loss']:.3f} -> {last['loss']:.3f}  "
          f"hash@{target} {hashes[p][:16]}  applied@{target} {last.get('applied')}  resyncs {last.get('resyncs', 0)}")
same = len(set(hashes.values())) == 1
print(f"identical hashes at round {target}: {same}")
sys.exit(0 if same else 2)
PY
}

# wait_for N R: poll until N peers passed round R-1 and agree on its hash (exit like check).
end=$((SECONDS + timeout))
wait_for() {
  while :; do
    set +e; out=$(check "$1" "$2"); rc=$?; set -e
    echo "$out" | head -1
    if [ $rc -eq 0 ]; then echo "$out"; return 0; fi
    if [ $rc -eq 2 ]; then echo "$out"; compose logs --tail 30; echo "[docker_swarm] FAILED: hashes differ"; exit 2; fi
    if [ $rc -ne 1 ]; then echo "$out"; echo "[docker_swarm] FAILED: the check itself failed (rc=$rc)"; exit 3; fi
    if [ $SECONDS -ge $end ]; then compose logs --tail 30; echo "[docker_swarm] FAILED: timeout"; exit 1; fi
    sleep 10
  done
}

if [ "$chaos" = 1 ]; then
  compose run -d --name "$straggler" peer peer --set swarm.slowdown=5 >/dev/null
  expect=$((peers + 1))
  echo "[docker_swarm] chaos: straggler $straggler started (inner steps 5x slower)"
  wait_for "$expect" 3
  victim=$(compose ps -q peer | head -n 1)
  echo "[docker_swarm] chaos: kill -9 of peer container ${victim:0:12}"
  docker kill -s KILL "$victim" >/dev/null
  sleep 20
  echo "[docker_swarm] chaos: restarting ${victim:0:12} with the same command and volume; adding a late joiner"
  docker start "$victim" >/dev/null
  compose up -d --no-recreate --scale peer=$((peers + 1))
  expect=$((expect + 1))
fi
wait_for "${expect:-$peers}" "$rounds"
compose ps
echo "[docker_swarm] OK"

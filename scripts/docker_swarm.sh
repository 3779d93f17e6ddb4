#!/usr/bin/env bash
# Bring up a gradnode swarm with docker compose (one bootstrap, PEERS peers), wait until every peer
# has finished ROUNDS rounds, check that all report the same weight hash for the same round, print
# each peer's loss, and tear everything down (volumes included).
#   PEERS=4 ROUNDS=5 PRESET=swarm-demo.yaml bash scripts/docker_swarm.sh
# CHAOS=1: a straggler (every inner step 5x slower) trains from the start; once every peer has
# finished round 2, kill -9 the bootstrap's container and one peer's, start both again (same keys,
# checkpoints and address books: the bootstrap comes back with an empty DHT and dials the peers it
# knew, the peer resumes and catches up) and scale up by two late joiners, which know only the
# bootstrap's address; the check then expects PEERS+3 peers on one hash, each container healthy.
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
# `gradnode health` (the peers' healthcheck) fails while a peer sees fewer trainers than this
export GRADNODE_EXPECT_PEERS=$peers
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
  boot=$(compose ps -q bootstrap)
  echo "[docker_swarm] chaos: kill -9 of the bootstrap ${boot:0:12} and of peer ${victim:0:12}"
  docker kill -s KILL "$boot" "$victim" >/dev/null
  sleep 20
  echo "[docker_swarm] chaos: starting both again with the same command and volumes; two late joiners"
  docker start "$boot" "$victim" >/dev/null
  compose up -d --no-recreate --scale peer=$((peers + 2))
  expect=$((expect + 2))
fi
wait_for "${expect:-$peers}" "$rounds"
# every peer container healthy (one swarm, enough trainers in sight), within a minute
for _ in $(seq 12); do
  states=$(for c in $(compose ps -q peer) $(docker ps -q --filter "name=$straggler"); do
    docker inspect -f '{{.State.Health.Status}}' "$c"; done | sort | uniq -c | tr '\n' ' ')
  case "$states" in *unhealthy*|*starting*) sleep 5 ;; *) break ;; esac
done
echo "[docker_swarm] peer health: $states"
compose ps
case "$states" in *unhealthy*|*starting*)
  for c in $(compose ps -q peer) $(docker ps -q --filter "name=$straggler"); do  # what each healthcheck said last
    echo "  ${c:0:12} $(docker inspect -f '{{.State.Health.Status}}: {{range .State.Health.Log}}{{.Output}}{{end}}' "$c" \
      | tr '\n' ' ' | tail -c 300)"
  done
  echo "[docker_swarm] FAILED: a peer is not healthy"; exit 4 ;;
esac
echo "[docker_swarm] OK"

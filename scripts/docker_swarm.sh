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
# MONITORING=1: with the compose file's `monitoring` profile; once the peers agree, wait until Prometheus
# scrapes every gradnode container (the bootstrap and each peer replica, health "up") and sees every
# peer's gradnode_round move on, print its targets and the query, and fetch the published Prometheus
# and status page URLs from the host.
# Works with `docker compose` and with `docker-compose` (v1).
#
# `remote` mode: a swarm over hosts that share nothing but the network, as docker/README.md sets it up.
#   PEERS=1 ROUNDS=3 bash scripts/docker_swarm.sh remote
# One user-defined network and no shared volume: a bootstrap that trains, its libp2p port published on
# the host's address on that network (GRADNODE_P2P_HOST_PORT, default 31337) and announced there
# (GRADNODE_ANNOUNCE), and PEERS joiners that know only the address it prints, as a machine elsewhere
# would dial a public host: the first through GRADNODE_INITIAL_PEER, the second with plain `join
# --initial-peer` and a published port of its own (the host port after the bootstrap's), and so on in
# turn. Every container leaves after ROUNDS rounds; the check wants each to exit 0 with the same final
# weight hash. It removes its containers (with their anonymous volumes) and its network; the image stays,
# as after `docker compose build`.
set -euo pipefail
mode=${1:-local}
case "$mode" in local|remote) ;; *) echo "usage: $0 [local|remote]" >&2; exit 2 ;; esac
peers=${PEERS:-4} rounds=${ROUNDS:-5} preset=${PRESET:-swarm-demo.yaml} timeout=${TIMEOUT:-900} chaos=${CHAOS:-0}
monitoring=${MONITORING:-0}
project=${PROJECT:-gradnode-check}
[ "$mode" = remote ] && peers=${PEERS:-1} rounds=${ROUNDS:-3} project=${PROJECT:-gradnode-remote}
cd "$(dirname "$0")/.."
profiles=""
[ "$monitoring" = 1 ] && profiles="--profile monitoring"
# shellcheck disable=SC2086  # $profiles: zero or two words
compose() {
  if docker compose version >/dev/null 2>&1; then docker compose -f docker/compose.yaml -p "$project" $profiles "$@"
  else docker-compose -f docker/compose.yaml -p "$project" $profiles "$@"; fi
}
# down takes every profile's containers, whichever this run started (an earlier run's included)
down() { profiles="--profile monitoring" compose down -v --remove-orphans >/dev/null 2>&1 || true; }
export GRADNODE_PRESET=$preset GRADNODE_ROUNDS=0

# remote mode: the containers are named after the project; nothing of the compose project starts
image=gradnode:${GRADNODE_VARIANT:-cpu} net=${project}-net boot=${project}-bootstrap
joiners() { for i in $(seq "$peers"); do echo "${project}-peer-$i"; done; }
remote_down() {
  # -v: the anonymous volumes of the image's /data and /swarm go with their containers
  # shellcheck disable=SC2046  # one word per joiner
  docker rm -f -v "$boot" $(joiners) >/dev/null 2>&1 || true
  docker network rm "$net" >/dev/null 2>&1 || true
}
# the final summary line's weight hash (`rounds=R loss=... hash=H ...`), empty while a container runs
final_hash() { docker logs "$1" 2>/dev/null | sed -n 's/^rounds=[0-9]* .* hash=\([0-9a-f]*\) .*/\1/p' | tail -n 1; }
remote() {
  trap 'echo "[docker_swarm] tearing down"; remote_down' EXIT
  remote_down
  local hostport=${GRADNODE_P2P_HOST_PORT:-31337} cfg=/opt/gradnode/configs/$preset end=$((SECONDS + timeout))
  compose build bootstrap
  docker network create "$net" >/dev/null
  # the host's address on the network: what the joiners dial, as they would dial a public host's address
  local gw
  gw=$(docker network inspect -f '{{range .IPAM.Config}}{{.Gateway}}{{end}}' "$net")
  docker run -d --name "$boot" --network "$net" -p "$gw:$hostport:31337/tcp" \
    -e GRADNODE_CONFIG="$cfg" -e GRADNODE_ANNOUNCE="/ip4/$gw/tcp/$hostport" -e GRADNODE_METRICS_PORT=0 \
    -e GRADNODE_STATUS_PORT=0 "$image" bootstrap --train --set "swarm.rounds=$rounds" >/dev/null
  echo "[docker_swarm] remote: bootstrap $boot published on $gw:$hostport; waiting for the address it announces"
  local maddr=""
  until maddr=$(docker logs "$boot" 2>/dev/null | grep -m 1 "^/ip4/$gw/tcp/$hostport/p2p/"); do
    if [ "$(docker inspect -f '{{.State.Running}}' "$boot")" != true ] || [ $SECONDS -ge $end ]; then
      docker logs --tail 30 "$boot"; echo "[docker_swarm] FAILED: the bootstrap announces no /ip4/$gw/tcp/$hostport"
      exit 1
    fi
    sleep 2
  done
  echo "[docker_swarm] remote: $maddr; $peers joiner(s), no shared volume, $rounds rounds each"
  # odd joiners: the `peer` role with GRADNODE_INITIAL_PEER; even ones: plain `join`, as docker/README.md's
  # GPU box runs it, with a published port of its own announced on the host's address
  local i=0 own
  for c in $(joiners); do
    i=$((i + 1)) own=$((hostport + i))
    if [ $((i % 2)) = 1 ]; then
      docker run -d --name "$c" --hostname "$c" --network "$net" -e GRADNODE_CONFIG="$cfg" \
        -e GRADNODE_INITIAL_PEER="$maddr" "$image" peer --rounds "$rounds" >/dev/null
    else
      docker run -d --name "$c" --network "$net" -p "$gw:$own:31337/tcp" "$image" join --config "$cfg" \
        --initial-peer "$maddr" --rounds "$rounds" --output-dir /data/peer \
        --listen /ip4/0.0.0.0/tcp/31337 --announce "/ip4/$gw/tcp/$own" >/dev/null
    fi
  done
  local c running  # grep -c fails on a count of 0: the loop ends once no container runs
  while running=$(for c in "$boot" $(joiners); do docker inspect -f '{{.State.Running}}' "$c"; done | grep -c true); do
    if [ $SECONDS -ge $end ]; then
      for c in "$boot" $(joiners); do echo "--- $c"; docker logs --tail 20 "$c" 2>&1; done
      echo "[docker_swarm] FAILED: timeout, $running container(s) still running"; exit 1
    fi
    sleep 5
  done
  local hashes="" code failed=0
  for c in "$boot" $(joiners); do
    code=$(docker inspect -f '{{.State.ExitCode}}' "$c")
    echo "  $c: exit $code  $(docker logs "$c" 2>/dev/null | grep '^rounds=' | tail -n 1)"
    if [ "$code" != 0 ] || [ -z "$(final_hash "$c")" ]; then
      failed=1; docker logs --tail 20 "$c" 2>&1 | sed 's/^/    /'
    fi
    hashes="$hashes$(final_hash "$c")"$'\n'
  done
  [ "$failed" = 0 ] || { echo "[docker_swarm] FAILED: a container did not finish its rounds"; exit 1; }
  local distinct
  distinct=$(printf '%s' "$hashes" | sort -u | grep -c .)
  echo "[docker_swarm] identical final hashes: $([ "$distinct" = 1 ] && echo True || echo False)"
  if [ "$distinct" != 1 ]; then
    for c in "$boot" $(joiners); do  # how each moved between chains: the post-mortem's first read
      echo "--- $c"; docker logs "$c" 2>&1 | grep -E 'round=[0-9]+ applied=|another chain|re-sync|state adopted' | tail -n 12
    done
    echo "[docker_swarm] FAILED: hashes differ"; exit 2
  fi
  echo "[docker_swarm] OK"
}
if [ "$mode" = remote ]; then remote; exit 0; fi
# `gradnode health` (the peers' healthcheck) fails while a peer sees fewer trainers than this
export GRADNODE_EXPECT_PEERS=$peers
straggler=${project}-straggler
trap 'echo "[docker_swarm] tearing down"; docker rm -f "$straggler" >/dev/null 2>&1 || true; down' EXIT

# start from a clean slate: leftovers of an earlier run (containers, volumes) would fool the check
docker rm -f "$straggler" >/dev/null 2>&1 || true
down
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
if [ "$monitoring" = 1 ]; then
  # the bootstrap and every replica of the scaled peer service (CHAOS: the late joiners too; not the
  # straggler, a one-off `run` container, which Docker's DNS does not list under the service name)
  targets=$((1 + peers)); [ "$chaos" = 1 ] && targets=$((targets + 2))
  echo "[docker_swarm] monitoring: waiting for Prometheus to scrape $targets gradnode targets"
  if ! compose exec -T prometheus python3 - "$targets" <<'PY'
import json, sys, time, urllib.parse, urllib.request
expect = int(sys.argv[1])
api = "http://127.0.0.1:9090/api/v1/"
def get(path, **query):
    with urllib.request.urlopen(api + path + "?" + urllib.parse.urlencode(query), timeout=10) as r:
        return json.load(r)["data"]
def rounds():  # peer instance -> (peer id, round), from Prometheus's latest scrape
    res = get("query", query='gradnode_round{job="peer"} * on(instance) group_left(peer) gradnode_peer_info')
    return {s["metric"]["instance"]: (s["metric"]["peer"], float(s["value"][1])) for s in res["result"]}
deadline, first, now, ok = time.time() + 180, None, {}, False
while not ok and time.time() < deadline:
    ts = [t for t in get("targets", state="active")["activeTargets"] if t["labels"]["job"] in ("bootstrap", "peer")]
    peers = {t["labels"]["instance"] for t in ts if t["labels"]["job"] == "peer"}
    now = rounds() if len(ts) == expect and all(t["health"] == "up" for t in ts) else {}
    if now and set(now) == peers:  # every target up, one series per peer: now every peer's round must move on
        if first is None or set(first) != peers:
            first = now
        ok = all(now[i][1] > first[i][1] for i in peers)
    if not ok:
        time.sleep(5)
print(f"targets ({len(ts)}, expected {expect}):")
for t in sorted(ts, key=lambda t: (t["labels"]["job"], t["labels"]["instance"])):
    print(f"  job={t['labels']['job']:<9} {t['scrapeUrl']:<30} health={t['health']:<4} "
          f"last scrape {t['lastScrape'][11:19]} ({t['lastScrapeDuration'] * 1000:.1f} ms) {t['lastError']}")
print('query gradnode_round{job="peer"} * on(instance) group_left(peer) gradnode_peer_info:')
for i, (peer, r) in sorted(now.items()):
    print(f"  {i:<18} peer={peer}  round {first[i][1]:.0f} -> {r:.0f}" if first and i in first else f"  {i} {peer} {r:.0f}")
sys.exit(0 if ok else 1)
PY
  then compose logs --tail 30 prometheus; echo "[docker_swarm] FAILED: Prometheus does not scrape every peer"; exit 5; fi
  prom=http://127.0.0.1:${GRADNODE_PROMETHEUS_HOST_PORT:-9090} status=http://127.0.0.1:${GRADNODE_STATUS_HOST_PORT:-8080}
  if command -v curl >/dev/null; then
    curl -fsS -o /dev/null "$prom/api/v1/query?query=up" && curl -fsS -o /dev/null "$status/" \
      || { echo "[docker_swarm] FAILED: $prom or $status does not answer from the host"; exit 5; }
    echo "[docker_swarm] from the host: Prometheus $prom and the status page $status answer"
  fi
fi
echo "[docker_swarm] OK"

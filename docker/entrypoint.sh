#!/bin/sh
# Container roles. `bootstrap` serves the DHT with a stable identity (and, restarted, dials the peers of
# its address book) and writes its multiaddrs to /swarm; `peer` waits for them and joins. Anything else
# runs `gradnode <args>`.
set -eu
role=${1:-peer}
[ $# -gt 0 ] && shift
config=${GRADNODE_CONFIG:-/opt/gradnode/configs/tiny-cpu.yaml}
case "$role" in
  bootstrap)
    rm -f /swarm/bootstrap.maddrs
    exec gradnode bootstrap --config "$config" --host /ip4/0.0.0.0/tcp/31337 \
      --maddrs-file /swarm/bootstrap.maddrs --set run.output_dir=/data/bootstrap "$@" ;;
  peer)
    until [ -s /swarm/bootstrap.maddrs ]; do sleep 1; done
    # the container-network address, not loopback
    maddr=$(grep -v '/ip4/127\.' /swarm/bootstrap.maddrs | head -n 1)
    dir=/data/$(hostname)
    mkdir -p "$dir"
    # a restarted container keeps its folder: its key, checkpoints and address book (it finds the swarm
    # through the peers it knew even when the bootstrap's address changed or its DHT is empty)
    exec gradnode join --config "$config" --initial-peer "$maddr" --output-dir "$dir" \
      --metrics "$dir/metrics.jsonl" --summary "$dir/summary.json" \
      --set "swarm.expected_peers=${GRADNODE_EXPECT_PEERS:-0}" "$@" ;;
  *)
    exec gradnode "$role" "$@" ;;
esac

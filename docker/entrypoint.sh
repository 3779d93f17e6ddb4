#!/bin/sh
# Container roles. `bootstrap` serves the DHT with a stable identity (and, restarted, dials the peers of
# its address book) and writes its multiaddrs to /swarm; `peer` waits for them and joins. Anything else
# runs `gradnode <args>`.
# GRADNODE_METRICS_PORT (default 9100, 0: off): both roles serve Prometheus metrics there (what the
# compose file's `monitoring` profile scrapes); GRADNODE_STATUS_PORT (default 8080, 0: off): the bootstrap's
# status page. Both listen on every interface of the container: what reaches them from the host is what
# the port mappings publish. Arguments given to the container come later and win.
set -eu
role=${1:-peer}
[ $# -gt 0 ] && shift
config=${GRADNODE_CONFIG:-/opt/gradnode/configs/tiny-cpu.yaml}
case "$role" in bootstrap|peer)
  set -- --set metrics.host=0.0.0.0 --set "metrics.port=${GRADNODE_METRICS_PORT:-9100}" "$@" ;;
esac
case "$role" in
  bootstrap)
    rm -f /swarm/bootstrap.maddrs
    status_port=${GRADNODE_STATUS_PORT:-8080}
    [ "$status_port" = 0 ] || set -- --status-port "$status_port" "$@"
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

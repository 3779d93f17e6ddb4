#!/bin/sh
# Container roles. `bootstrap` serves the DHT with a stable identity (and, restarted, dials the peers of
# its address book) and writes its multiaddrs to /swarm; `peer` joins the bootstrap named by
# GRADNODE_INITIAL_PEER, or else waits for the bootstrap's multiaddrs in /swarm (a volume shared on one
# host). Anything else runs `gradnode <args>`.
# Both roles listen for libp2p on port GRADNODE_PORT (default 31337) of every interface of the container.
# GRADNODE_ANNOUNCE: the public multiaddrs others dial, e.g. /ip4/203.0.113.7/tcp/31337 (several: comma or
# space separated; the host must publish that port); the container's own network addresses are announced
# beside them, so that containers on the same Docker network still reach it directly.
# GRADNODE_INITIAL_PEER (peer role): the bootstrap's multiaddrs, ending with /p2p/<its peer id>, as it
# prints them (several: comma or space separated).
# GRADNODE_METRICS_PORT (default 9100, 0: off): both roles serve Prometheus metrics there (what the
# compose file's `monitoring` profile scrapes); GRADNODE_STATUS_PORT (default 8080, 0: off): the bootstrap's
# status page. Both listen on every interface of the container: what reaches them from the host is what
# the port mappings publish. Arguments given to the container come later and win.
set -eu
role=${1:-peer}
[ $# -gt 0 ] && shift
config=${GRADNODE_CONFIG:-/opt/gradnode/configs/tiny-cpu.yaml}
port=${GRADNODE_PORT:-31337}

# words: a comma or space separated list, one item a line
words() { printf '%s\n' "$1" | tr -s ', ' '\n' | grep -v '^$' || true; }

# The announce list as a YAML flow list of quoted strings (what `--set` parses), empty without
# GRADNODE_ANNOUNCE: libp2p then announces every listen address itself.
announce_list() {
  [ -n "${GRADNODE_ANNOUNCE:-}" ] || return 0
  {
    words "$GRADNODE_ANNOUNCE"
    for ip in $(hostname -I 2>/dev/null || true); do
      case "$ip" in *.*) [ "${ip#127.}" = "$ip" ] && echo "/ip4/$ip/tcp/$port" ;; esac
    done
  } | awk 'BEGIN { printf "[" } { printf "%s\"%s\"", (NR > 1 ? "," : ""), $0 } END { printf "]" }'
}

case "$role" in bootstrap|peer)
  announce=$(announce_list)
  [ -z "$announce" ] || set -- --set "swarm.announce_maddrs=$announce" "$@"
  set -- --set "swarm.host_maddrs=[\"/ip4/0.0.0.0/tcp/$port\"]" \
    --set metrics.host=0.0.0.0 --set "metrics.port=${GRADNODE_METRICS_PORT:-9100}" "$@" ;;
esac
case "$role" in
  bootstrap)
    rm -f /swarm/bootstrap.maddrs
    status_port=${GRADNODE_STATUS_PORT:-8080}
    [ "$status_port" = 0 ] || set -- --status-port "$status_port" "$@"
    exec gradnode bootstrap --config "$config" --maddrs-file /swarm/bootstrap.maddrs \
      --set run.output_dir=/data/bootstrap "$@" ;;
  peer)
    if [ -n "${GRADNODE_INITIAL_PEER:-}" ]; then
      peers=$(words "$GRADNODE_INITIAL_PEER")
    else
      until [ -s /swarm/bootstrap.maddrs ]; do sleep 1; done
      # every address but loopback (the container's own): the container-network one, and any announced one
      peers=$(grep -v '/ip4/127\.' /swarm/bootstrap.maddrs) \
        || { echo "gradnode-entrypoint: /swarm/bootstrap.maddrs lists loopback only" >&2; exit 1; }
    fi
    for maddr in $peers; do set -- --initial-peer "$maddr" "$@"; done
    dir=/data/$(hostname)
    mkdir -p "$dir"
    # a restarted container keeps its folder: its key, checkpoints and address book (it finds the swarm
    # through the peers it knew even when the bootstrap's address changed or its DHT is empty)
    exec gradnode join --config "$config" --output-dir "$dir" \
      --metrics "$dir/metrics.jsonl" --summary "$dir/summary.json" \
      --set "swarm.expected_peers=${GRADNODE_EXPECT_PEERS:-0}" "$@" ;;
  *)
    exec gradnode "$role" "$@" ;;
esac

#!/usr/bin/env bash
# README.md's two commands, verbatim, on a fresh machine: a throwaway container from a bare
# python:3.11-slim (no C compiler, no iptables, no matplotlib, no transformers; on these machines
# ../shared/tools/docker-up.sh provides that image), with a fresh clone of the branch copied in.
# Prints each command's exit status, time and the tail of its output (a failing command's whole output is
# kept in $TMPDIR, its path printed); exits non-zero if either fails.
#   bash scripts/fresh_machine_check.sh [BRANCH]        (default: main)
set -euo pipefail
cd "$(dirname "$0")/.."
branch=${1:-main}
image=${IMAGE:-python:3.11-slim}
name=gradnode-fresh-$$
work=$(mktemp -d)
trap 'docker rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT

git clone -q --no-local --branch "$branch" . "$work/gradnode"
echo "[fresh] clone of $branch at $(git -C "$work/gradnode" rev-parse --short HEAD)"
# the first two ```bash blocks under "## Set-up" in README.md, as written there
python3 - "$work/gradnode/README.md" "$work" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
setup = text[text.index("## Set-up"):]
blocks = re.findall(r"```bash\n(.*?)```", setup, flags=re.S)[:2]
assert len(blocks) == 2, "README.md's set-up section must hold two ```bash blocks"
for i, block in enumerate(blocks, 1):
    open(f"{sys.argv[2]}/command{i}.sh", "w").write(block)
PY

docker run -d --init --name "$name" --shm-size 1g "$image" sleep infinity >/dev/null
docker cp "$work/gradnode" "$name:/root/gradnode"
echo "[fresh] container $name from $image:" \
  "$(docker exec "$name" sh -c 'for t in cc gcc iptables docker chromium; do command -v $t >/dev/null && printf "%s " $t; done; echo' \
     | sed 's/^$/no cc, gcc, iptables, docker or chromium/')"
status=0
for i in 1 2; do
  cmd=$(cat "$work/command$i.sh")
  echo "[fresh] README command $i: $cmd"
  start=$SECONDS
  set +e
  docker exec -w /root/gradnode "$name" bash -c "$cmd" >"$work/out$i.log" 2>&1
  rc=$?
  set -e
  secs=$((SECONDS - start))
  echo "[fresh] command $i: exit $rc after $((secs / 60)) min $((secs % 60)) s; last lines:"
  tail -n 25 "$work/out$i.log" | sed 's/^/    /'
  if [ $rc -ne 0 ]; then  # the whole output of a failing command outlives the check (the tail rarely says why)
    status=1
    keep="${TMPDIR:-/tmp}/gradnode-fresh-$$-command$i.log"
    cp "$work/out$i.log" "$keep"
    echo "[fresh] command $i's whole output: $keep"
  fi
done
echo "[fresh] leftovers in the container's /tmp after both commands:" \
  "$(docker exec "$name" sh -c 'ls /tmp | grep -E "hivemind|pymp|gn-" | wc -l') entries"
[ $status -eq 0 ] && echo "[fresh] OK: both README commands passed" || echo "[fresh] FAILED"
exit $status

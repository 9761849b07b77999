#!/usr/bin/env bash
# Sets up hostkv on a fresh Debian 12 machine and runs the daemon on its
# defaults: installs the packages, builds hostkvd and the hostkv CLI into
# build/ (the same build as tests/run_all.sh), starts hostkvd on
# $HOSTKV_TARGET (default unix:/run/hostkv/hostkvd.sock), runs the demo (KV
# pages backed up, cleared, loaded back and verified byte for byte; then the
# same through SGLang's host-pool class, hostkv.sglang, from Python; then a
# warm restart: an engine publishes its KV pages to the page cache and is
# killed, and its successor finds and loads them, bytes checked; then two
# more daemons, two "nodes", share a Redis as their storage tier: a page
# published on one is found and read byte-exact on the other), shows the
# occupancy, and leaves the daemon running in the foreground (Ctrl-C stops
# it). Without root:
#   HOSTKV_TARGET=unix:/tmp/hostkv/hostkvd.sock ./deploy/quickstart.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=${HOSTKV_TARGET:-unix:/run/hostkv/hostkvd.sock}
if [[ "$TARGET" != unix:* ]]; then
  echo "quickstart: HOSTKV_TARGET must be unix:PATH (got '$TARGET')" >&2
  exit 2
fi
SOCKET=${TARGET#unix:}
./deploy/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target hostkvd hostkv
SUDO=""
if [ ! -w "$(dirname "$(dirname "$SOCKET")")" ] && [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
CLI=(./build/client/hostkv --target="$TARGET")
if $SUDO "${CLI[@]}" health >/dev/null 2>&1; then
  echo "quickstart: a hostkvd already serves $TARGET: stop it first, or run" \
       "HOSTKV_TARGET=unix:/tmp/hostkv/hostkvd.sock ./deploy/quickstart.sh" >&2
  exit 1
fi
$SUDO ./build/server/hostkvd --listen="$TARGET" --memory_reserve=1GiB &
DAEMON=$!
# Stops the daemon (it drains and exits 0) and returns its exit status.
# (Started in the background by a script, hostkvd ignores the terminal's
# Ctrl-C itself: the script passes it on as SIGTERM, once.)
stop_daemon() {
  trap - EXIT INT TERM
  $SUDO kill -TERM "$DAEMON" 2>/dev/null || true
  local status=0
  wait "$DAEMON" || status=$?
  return $status
}
# Ctrl-C: the quickstart ends as the daemon does (0 for a clean stop).
trap 'echo; stop_daemon; status=$?; keeper_note; exit $status' INT TERM
# Any other end (a failed step): the daemon does not outlive the script.
trap 'stop_daemon || true' EXIT
keeper_note() {
  echo "quickstart: hostkvd stopped. Its state keeper (hostkvd --state_keeper," \
       "see its last log line) holds the pools and cached pages for 10 minutes," \
       "so that running ./deploy/quickstart.sh again starts warm; it exits by" \
       "itself then."
}
for _ in $(seq 100); do
  if ! ps -p "$DAEMON" >/dev/null; then
    trap - EXIT INT TERM
    wait "$DAEMON" || true
    echo "quickstart: hostkvd did not start (its error is above)" >&2
    exit 1
  fi
  $SUDO "${CLI[@]}" health >/dev/null 2>&1 && break
  sleep 0.1
done
echo; echo "== hostkv demo =="
$SUDO "${CLI[@]}" demo
echo; echo "== SGLang's host pool on hostkvd (Python: hostkv.sglang) =="
[ -x build/venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages build/venv
build/venv/bin/pip install -q --no-deps --no-build-isolation ./client/python
$SUDO build/venv/bin/python client/python/examples/sglang_cpu_demo.py "$TARGET"
echo; echo "== A warm restart: an engine publishes its pages and is killed; its successor loads them =="
$SUDO build/venv/bin/python client/python/examples/warm_restart_demo.py "$TARGET"
echo; echo "== Two nodes, one Redis: pages published on one daemon are found on another =="
build/venv/bin/python client/python/examples/two_node_demo.py --hostkvd build/server/hostkvd
echo; echo "== hostkv stats =="
$SUDO "${CLI[@]}" stats
echo
echo "hostkvd is serving $TARGET (Ctrl-C stops it; its state keeper then holds"
echo "the pools for 10 minutes, for a warm restart). In another terminal, try:"
echo "  ./build/client/hostkv pools"
echo "  grpcurl -plaintext -emit-defaults -unix $SOCKET hostkv.v1.HostKV/GetPoolStats"
[ "$TARGET" = unix:/run/hostkv/hostkvd.sock ] ||
  echo "  (first: export HOSTKV_TARGET=$TARGET)"
status=0
wait "$DAEMON" || status=$?
trap - EXIT INT TERM
exit $status

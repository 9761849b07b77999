#!/usr/bin/env bash
# Sets up hostkv on a fresh Debian 12 machine and runs the daemon on its
# defaults: installs the packages, builds hostkvd and the hostkv CLI, starts
# hostkvd on unix:/run/hostkv/hostkvd.sock, runs the demo (KV pages backed
# up, cleared, loaded back and verified byte for byte; then the same through
# SGLang's host-pool class, hostkv.sglang, from Python; then a warm restart:
# an engine publishes its KV pages to the page cache and is killed, and its
# successor finds and loads them, bytes checked; then two more daemons, two
# "nodes", share a Redis as their storage tier: a page published on one is
# found and read byte-exact on the other), shows the occupancy,
# and leaves the daemon running in the foreground (Ctrl-C stops it).
#   HOSTKV_SOCKET=/tmp/hostkv/hostkvd.sock ./deploy/quickstart.sh   # no root
set -euo pipefail
cd "$(dirname "$0")/.."
SOCKET=${HOSTKV_SOCKET:-/run/hostkv/hostkvd.sock}
./deploy/install_deps.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DHOSTKV_BUILD_TESTS=OFF \
  -DHOSTKV_ENABLE_CUDA=OFF >/dev/null
cmake --build build-release -j"$(nproc)" --target hostkvd hostkv
SUDO=""
if [ ! -w "$(dirname "$(dirname "$SOCKET")")" ] && [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
$SUDO ./build-release/server/hostkvd --listen="unix:$SOCKET" --memory_reserve=1GiB &
DAEMON=$!
trap 'kill -TERM $DAEMON 2>/dev/null; wait $DAEMON' EXIT INT TERM
for _ in $(seq 100); do [ -S "$SOCKET" ] && break; sleep 0.1; done
echo; echo "== hostkv demo =="
$SUDO ./build-release/client/hostkv --target="unix:$SOCKET" demo
echo; echo "== SGLang's host pool on hostkvd (Python: hostkv.sglang) =="
[ -x build-release/venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages build-release/venv
build-release/venv/bin/pip install -q --no-deps --no-build-isolation ./client/python
$SUDO build-release/venv/bin/python client/python/examples/sglang_cpu_demo.py "unix:$SOCKET"
echo; echo "== A warm restart: an engine publishes its pages and is killed; its successor loads them =="
$SUDO build-release/venv/bin/python client/python/examples/warm_restart_demo.py "unix:$SOCKET"
echo; echo "== Two nodes, one Redis: pages published on one daemon are found on another =="
build-release/venv/bin/python client/python/examples/two_node_demo.py \
  --hostkvd build-release/server/hostkvd
echo; echo "== hostkv stats =="
$SUDO ./build-release/client/hostkv --target="unix:$SOCKET" stats
echo
echo "hostkvd is serving unix:$SOCKET (Ctrl-C stops it). Try:"
echo "  ./build-release/client/hostkv --target=unix:$SOCKET pools"
echo "  grpcurl -plaintext -emit-defaults -unix $SOCKET hostkv.v1.HostKV/GetPoolStats"
wait $DAEMON

#!/bin/sh
# Container entrypoint: hostkvd with the container's flags; an optional
# config file mounted at /etc/hostkv/hostkvd.textproto is picked up.
set -e
if [ -f /etc/hostkv/hostkvd.textproto ]; then
  set -- --config=/etc/hostkv/hostkvd.textproto "$@"
fi
# hostkvd removes the segments a killed predecessor on the same socket left
# in /dev/shm itself (they are named after the socket, not the pid).
exec /usr/local/bin/hostkvd "$@"

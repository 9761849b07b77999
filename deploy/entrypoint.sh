#!/bin/sh
# Container entrypoint: hostkvd with the container's flags; an optional
# config file mounted at /etc/hostkv/hostkvd.textproto is picked up.
set -e
if [ -f /etc/hostkv/hostkvd.textproto ]; then
  set -- --config=/etc/hostkv/hostkvd.textproto "$@"
fi
# hostkvd names its segments /dev/shm/hostkv.<pid>.* and removes, at start,
# only those whose pid is dead. In a container it always gets the same pid
# (this shell's, exec keeps it), while /dev/shm (an emptyDir, the host's
# with hostIPC, a shareable IPC namespace) outlives a killed daemon: its
# segments would look alive, leak their memory and make the pools' names
# collide (shm_open: File exists) at every restart. Nothing alive can own
# segments named after the pid that is about to become hostkvd.
rm -f /dev/shm/hostkv."$$".*
exec /usr/local/bin/hostkvd "$@"

"""Where hostkvd is: the target a user gives, and what a closed socket says.

The same rules as the C++ client (client/daemon_target.cc): an empty target
is $HOSTKV_TARGET, else unix:/run/hostkv/hostkvd.sock; tcp:PORT (hostkvd's
own --listen form) is 127.0.0.1:PORT; a bare path is refused with the
unix: form to use.
"""
import grp
import os
import pwd
import stat

from . import errors

DEFAULT_TARGET = "unix:/run/hostkv/hostkvd.sock"


def resolve(target=None):
    """The gRPC target to dial for `target` (None or "": $HOSTKV_TARGET)."""
    target = target or os.environ.get("HOSTKV_TARGET") or DEFAULT_TARGET
    if target.startswith("unix:"):
        return target
    if target.startswith("tcp:"):
        return "127.0.0.1:" + target[4:]
    if target.startswith(("/", ".")) or target.endswith(".sock"):
        raise errors.InvalidArgument(
            f"target '{target}' is a path: a Unix socket is unix:{target} "
            "(TCP: HOST:PORT or tcp:PORT)")
    return target


def _name(lookup, number, kind):
    try:
        return f"{lookup(number)[0]} ({kind} {number})"
    except KeyError:
        return f"{kind} {number}"


def _denied(path, st, what):
    return errors.PermissionDenied(
        f"permission denied on {path} (owner {_name(pwd.getpwuid, st.st_uid, 'uid')}, "
        f"group {_name(grp.getgrgid, st.st_gid, 'gid')}, mode {st.st_mode & 0o7777:04o}): "
        f"{what} needs that uid or that group (hostkvd's --socket_group; `id` shows yours)")


def check_socket(path):
    """Raises Unavailable if nothing listens at `path`, PermissionDenied
    naming the directory or socket closed to this process."""
    try:
        st = os.stat(path)
    except PermissionError:
        directory = os.path.dirname(path)
        while directory not in ("", "/"):
            try:
                dst = os.stat(directory)
            except OSError:
                dst = None
            if dst is not None and not os.access(directory, os.X_OK):
                raise _denied(directory, dst, "reaching hostkvd's socket") from None
            directory = os.path.dirname(directory)
        raise errors.PermissionDenied(f"permission denied on {path}") from None
    except OSError:
        raise errors.Unavailable(f"no hostkvd socket at {path} (is hostkvd running?)") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise errors.Unavailable(
            f"{path} is not a socket (is hostkvd running? is the target its --listen?)")
    if not os.access(path, os.R_OK | os.W_OK):
        raise _denied(path, st, "connecting to hostkvd")

"""Names an engine derives, reserved to its user in hostkvd.

vLLM's and SGLang's adapters name their pools and cache namespaces from
the model and the layout, so that every instance of the same model on the
node finds the same pages. Anyone can compute such a name; hostkvd lets
only uid N create a pool, or first publish in a namespace, whose name
begins with "uid<N>." (server/pool/reserved_names.h). With that prefix no
other user can take an engine's name first: make it attach to their pool,
or be refused its own namespace.
"""
import logging
import os

from . import _target

logger = logging.getLogger("hostkv")


def owner_prefix(target=None, shared=False):
    """"uid<N>." for this process's uid; "" when `shared` (the operator
    shares derived names across users on purpose: any user may then take
    them first) or when the target is not a Unix socket (TCP sessions are
    unverified: hostkvd would refuse them a reserved name)."""
    if shared:
        logger.warning("hostkv names shared across users: another user could create these "
                       "pools or namespaces first")
        return ""
    if not _target.resolve(target).startswith("unix:"):
        return ""
    return f"uid{os.getuid()}."

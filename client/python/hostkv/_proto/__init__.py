"""Generated gRPC stubs of hostkv.v1 (hostkv_pb2, hostkv_pb2_grpc).

Generated at package build time (setup.py) or by CMake; never committed.
$HOSTKV_PROTO_DIR names another folder holding them (the build tree, for
tests run from the source tree).
"""
import os as _os

if _os.environ.get("HOSTKV_PROTO_DIR"):
    __path__.append(_os.environ["HOSTKV_PROTO_DIR"])  # noqa: F821

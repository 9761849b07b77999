"""Builds the hostkv package: generates the gRPC stubs from hostkv.proto.

The proto is found at $HOSTKV_PROTO, else in the repository
(../../proto/hostkv/v1/hostkv.proto from this folder).
"""
import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithStubs(build_py):
    def run(self):
        super().run()
        sys.path.insert(0, HERE)
        import gen_stubs  # pylint: disable=import-outside-toplevel
        proto = os.environ.get("HOSTKV_PROTO") or os.path.join(
            HERE, "..", "..", "proto", "hostkv", "v1", "hostkv.proto")
        if not os.path.exists(proto):
            raise RuntimeError(f"hostkv.proto not found at {proto} (set HOSTKV_PROTO)")
        gen_stubs.generate(proto, os.path.join(self.build_lib, "hostkv", "_proto"))
        # Installed next to the package, in site-packages: SGLANG_HOSTKV=1
        # then patches SGLang at interpreter start (hostkv/sglang/patch.py).
        self.copy_file(os.path.join(HERE, "hostkv-sglang.pth"),
                       os.path.join(self.build_lib, "hostkv-sglang.pth"))


setup(cmdclass={"build_py": BuildWithStubs})

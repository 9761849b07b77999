#!/usr/bin/python3
"""Generates hostkv_pb2.py and hostkv_pb2_grpc.py from hostkv.proto.

usage: gen_stubs.py PROTO_FILE OUT_DIR

The stubs are flat modules of the package hostkv._proto: protoc's
`import hostkv_pb2` is rewritten to a relative import. Uses /usr/bin/protoc
with grpc_python_plugin when both are installed, else grpc_tools.protoc.
Run by setup.py (package build) and by CMake (tests); never committed.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile


def _run_protoc(proto_dir, proto_name, out_dir):
    protoc = shutil.which("protoc", path="/usr/bin") or shutil.which("protoc")
    plugin = (shutil.which("grpc_python_plugin", path="/usr/bin")
              or shutil.which("grpc_python_plugin"))
    args = [f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_out={out_dir}"]
    if protoc and plugin:
        subprocess.run([protoc, *args, f"--plugin=protoc-gen-grpc={plugin}", proto_name],
                       check=True)
        return
    from grpc_tools import protoc as grpc_protoc  # pylint: disable=import-outside-toplevel
    args = [a.replace("--grpc_out", "--grpc_python_out") for a in args]
    if grpc_protoc.main(["protoc", *args, proto_name]) != 0:
        raise RuntimeError(f"protoc failed on {proto_name}")


def generate(proto_file, out_dir):
    proto_dir, proto_name = os.path.split(os.path.abspath(proto_file))
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _run_protoc(proto_dir, proto_name, tmp)
        for name in ("hostkv_pb2.py", "hostkv_pb2_grpc.py"):
            with open(os.path.join(tmp, name), encoding="utf-8") as f:
                text = f.read()
            text = re.sub(r"^import hostkv_pb2 as ", "from . import hostkv_pb2 as ", text,
                          flags=re.MULTILINE)
            # Written whole, then renamed: a parallel build never sees half a file.
            partial = os.path.join(out_dir, name + ".tmp")
            with open(partial, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(partial, os.path.join(out_dir, name))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    generate(sys.argv[1], sys.argv[2])

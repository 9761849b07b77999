#!/usr/bin/python3
"""What the hostkvd images are made from, as one digest, and the check that
tests/deploy/image_test.py was run on the checkout's inputs.

usage: image_inputs.py --source=DIR          print the digest
       image_inputs.py --source=DIR --check  compare with image_test.stamp

The inputs: the Dockerfile, .dockerignore, the entrypoint, install_deps.sh
(the packages), and the link line: every find_package and
target_link_libraries call of the CMake files hostkvd and hostkv are built
from (comments and spacing ignored). A change to any of them needs a new
run of `tests/deploy/image_test.py --record` (tests/deploy/README.md).
"""
import argparse
import glob
import hashlib
import os
import re
import sys

FILES = ("Dockerfile", ".dockerignore", "deploy/entrypoint.sh", "deploy/install_deps.sh")
CMAKE_DIRS = ("", "proto", "kernels", "server", "client")
LINK_CALL = re.compile(r"\b(find_package|target_link_libraries)\s*\([^)]*\)", re.S)


def link_lines(source):
    lines = []
    for d in CMAKE_DIRS:
        pattern = os.path.join(source, d, "CMakeLists.txt") if not d else \
            os.path.join(source, d, "**", "CMakeLists.txt")
        for path in sorted(glob.glob(pattern, recursive=True)):
            with open(path) as f:
                text = re.sub(r"#[^\n]*", "", f.read())
            for m in LINK_CALL.finditer(text):
                lines.append(f"{os.path.relpath(path, source)}: {' '.join(m.group(0).split())}")
    return lines


def inputs_digest(source):
    h = hashlib.sha256()
    for rel in FILES:
        with open(os.path.join(source, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + f.read() + b"\0")
    for line in link_lines(source):
        h.update(line.encode() + b"\n")
    return h.hexdigest()[:16]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    digest = inputs_digest(os.path.realpath(a.source))
    if not a.check:
        print(digest)
        return
    stamp = os.path.join(os.path.dirname(os.path.abspath(__file__)), "image_test.stamp")
    recorded = {}
    if os.path.exists(stamp):
        with open(stamp) as f:
            for line in f:
                if line.strip() and not line.startswith("#"):
                    k, _, v = line.strip().partition(" ")
                    recorded[k] = v
    if recorded.get("inputs") != digest:
        sys.exit(f"FAIL: the image inputs changed (digest {digest}, image_test.stamp has "
                 f"{recorded.get('inputs')}): rebuild and run the images with\n"
                 f"  /usr/bin/python3 tests/deploy/image_test.py --source=. --build=build --record\n"
                 f"and commit tests/deploy/image_test.stamp (tests/deploy/README.md)")
    print(f"PASS: image_test.py passed on these inputs ({recorded.get('images')}; "
          f"commit {recorded.get('commit')}, {recorded.get('date')})")


if __name__ == "__main__":
    main()

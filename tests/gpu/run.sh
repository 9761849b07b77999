#!/usr/bin/env bash
# Kept for old instructions: the GPU machine has none of our libraries and
# no package registry, so nothing is built there any more. Build the bundle
# here (tests/gpu/bundle.sh, see kernels/README.md "The GPU backend"), carry it, and run
# its run.sh there; this runs BUNDLE (default build-gpu-bundle) with the
# same arguments.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bundle=${BUNDLE:-$root/build-gpu-bundle}
if [ ! -x "$bundle/run.sh" ]; then
  echo "tests/gpu/run.sh: no bundle at $bundle: run tests/gpu/bundle.sh first" >&2
  exit 1
fi
exec "$bundle/run.sh" "$@"

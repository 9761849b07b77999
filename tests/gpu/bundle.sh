#!/usr/bin/env bash
# Builds the self-contained GPU bundle: everything the GPU machine needs to
# run the GPU tests and benchmarks, which has none of our C++ libraries and
# reaches no package registry.
#
#   tests/gpu/bundle.sh [DIR]                       # build, then write DIR
#   tests/gpu/bundle.sh --from-build BUILD [DIR]    # package BUILD's binaries
#   tests/gpu/bundle.sh ... --check                 # then DIR/run.sh --check
#
# DIR (default build-gpu-bundle, relative to the repository root) gets:
#   bin/      hostkvd, every GPU test binary (ctest label `gpu`),
#             hostkv_gpu_bench, hostkv_signal_bench (debug info stripped)
#   lib/      every shared library they load except the NVIDIA driver's
#             (libcuda.so.1, libnvidia-*), glibc's compatibility stubs the
#             driver may load, and the dynamic loader ld-linux-x86-64.so.2
#   python/   the pure-Python client (client/python/hostkv, with its
#             generated _proto stubs), tests/gpu/torch_e2e*.py and the vLLM
#             stand-in (tests/python/vllm_standin), which the
#             machine's own python3 runs (torch 2.x with CUDA there)
#   tests.txt the GPU test binaries, one a line; MANIFEST (commit, sizes)
#   run.sh    tests/gpu/bundle_run.sh: runs it all on the GPU machine
# Every binary runs as DIR/lib/ld-linux-x86-64.so.2 --library-path DIR/lib
# DIR/bin/X, so the machine's own glibc is never mixed with ours.
#
# Without --from-build it builds Release with CUDA for sm_90 plus PTX in
# BUILD_DIR (default build-gpu-release), only the targets the bundle needs,
# with JOBS (default nproc) jobs. --from-build packages an existing CUDA
# build instead (the ctest `gpu_bundle_check` does, to keep CI short).
# Fails if DIR would be over 64 MiB (what the device tool carries).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
from_build=""
check=0
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --from-build) from_build=$2; shift 2 ;;
    --check) check=1; shift ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    -*) echo "bundle.sh: unknown flag $1" >&2; exit 2 ;;
    *) dir=$1; shift ;;
  esac
done
dir=${dir:-build-gpu-bundle}
case "$dir" in /*) ;; *) dir=$root/$dir ;; esac
started=$(date +%s)

# The GPU test binaries: the executables of the tests labelled `gpu`, read
# from the generated CTestTestfile.cmake files (ctest -N prints no path for
# an executable not built yet).
gpu_tests() {
  find "$1" -name CTestTestfile.cmake -print0 | xargs -0 awk '
    /^add_test\(/ { name = $1; sub(/^add_test\(\[=\[/, "", name); sub(/\]=\]$/, "", name)
                    path = $2; gsub(/[")]/, "", path); paths[name] = path }
    /^set_tests_properties\(/ && /LABELS "([^"]*;)?gpu(;[^"]*)?"/ {
      name = $1; sub(/^set_tests_properties\(\[=\[/, "", name); sub(/\]=\]$/, "", name)
      gpu[name] = 1 }
    END { for (n in gpu) print paths[n] }' | sort
}

if [ -z "$from_build" ]; then
  build=${BUILD_DIR:-build-gpu-release}
  case "$build" in /*) ;; *) build=$root/$build ;; esac
  mkdir -p "$build"
  if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DHOSTKV_ENABLE_CUDA=ON '-DCMAKE_CUDA_ARCHITECTURES=90-real;90-virtual' \
      > "$build/bundle-configure.log" 2>&1; then
    tail -n 30 "$build/bundle-configure.log" >&2
    echo "bundle.sh: configure failed ($build/bundle-configure.log)" >&2
    exit 1
  fi
  grep -q "hostkv: CUDA sources ON" "$build/bundle-configure.log" \
    || { echo "bundle.sh: no nvcc found: a GPU bundle needs the CUDA build" >&2; exit 1; }
  mapfile -t tests < <(gpu_tests "$build")
  [ ${#tests[@]} -gt 0 ] || { echo "bundle.sh: no test labelled gpu in $build" >&2; exit 1; }
  targets=(hostkvd hostkv_gpu_bench hostkv_signal_bench)
  for t in "${tests[@]}"; do targets+=("$(basename "$t")"); done
  echo "bundle.sh: building ${targets[*]} in $build"
  cmake --build "$build" -j"${JOBS:-$(nproc)}" --target "${targets[@]}"
else
  build=$(cd "$from_build" && pwd)
  mapfile -t tests < <(gpu_tests "$build")
  [ ${#tests[@]} -gt 0 ] || { echo "bundle.sh: no test labelled gpu in $build" >&2; exit 1; }
fi
built=$(date +%s)

# Where a target's binary is (the tests' paths come from ctest).
binary() {
  local found
  found=$(find "$build" -maxdepth 3 -type f -name "$1" -perm -u+x | head -n 1)
  [ -n "$found" ] || { echo "bundle.sh: $1 is not built in $build" >&2; exit 1; }
  echo "$found"
}
sources=("$(binary hostkvd)" "$(binary hostkv_gpu_bench)" "$(binary hostkv_signal_bench)")
for t in "${tests[@]}"; do
  [ -x "$t" ] || { echo "bundle.sh: $t is not built" >&2; exit 1; }
  sources+=("$t")
done

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib"
for s in "${sources[@]}"; do
  strip --strip-debug -o "$dir/bin/$(basename "$s")" "$s"
done
for t in "${tests[@]}"; do basename "$t"; done > "$dir/tests.txt"

# The loader the binaries were linked against, and every library they load
# (ldd resolves the whole tree), but not the driver's: that must be the
# machine's own, matching its kernel module.
interp=$(readelf -l "${sources[0]}" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
[ "$(basename "$interp")" = ld-linux-x86-64.so.2 ] \
  || { echo "bundle.sh: unexpected loader '$interp'" >&2; exit 1; }
cp -L "$interp" "$dir/lib/ld-linux-x86-64.so.2"
for s in "${sources[@]}"; do
  ldd "$s" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  case "$name" in libcuda.so*|libnvidia-*) continue ;; esac
  cp -L "$path" "$dir/lib/$name"
done
# libcuda.so.1 and the driver's own libraries link against these; from the
# machine's glibc they would not match our libc.so.6.
libc_dir=$(dirname "$(ldd "${sources[0]}" | awk '$1 == "libc.so.6" {print $3}')")
for stub in libdl.so.2 libpthread.so.0 librt.so.1 libm.so.6 libutil.so.1; do
  [ -e "$dir/lib/$stub" ] || [ ! -e "$libc_dir/$stub" ] || cp -L "$libc_dir/$stub" "$dir/lib/$stub"
done
chmod u+w "$dir"/lib/*

# The Python client and the torch CUDA check. The stubs are generated here
# (gen_stubs.py, as CMake does: Debian's protoc 3.21); the build's copies
# when that cannot run. Without either the bundle has no python/ and run.sh
# skips that phase.
mkdir -p "$dir/python"
cp -r "$root/client/python/hostkv" "$dir/python/hostkv"
cp "$root/client/python/hostkv_sglang_hook.py" "$dir/python/"
find "$dir/python" -name __pycache__ -prune -exec rm -rf {} +
stubs=$dir/python/hostkv/_proto
if ! /usr/bin/python3 "$root/client/python/gen_stubs.py" "$root/proto/hostkv/v1/hostkv.proto" \
    "$stubs" > "$dir/stubs.log" 2>&1 \
    && ! cp "$build/client/python/hostkv_proto/hostkv_pb2.py" \
      "$build/client/python/hostkv_proto/hostkv_pb2_grpc.py" "$stubs/" 2> /dev/null; then
  echo "bundle.sh: warning: no Python stubs (gen_stubs.py: $(tail -n 1 "$dir/stubs.log")):" \
    "the bundle carries no Python client" >&2
  rm -rf "$dir/python"
else
  cp "$root/tests/gpu/torch_e2e.py" "$root/tests/gpu/torch_e2e_engines.py" \
    "$root/tests/gpu/torch_e2e_sglang.py" "$root/tests/gpu/torch_e2e_vllm.py" "$dir/python/"
  cp -r "$root/tests/python/vllm_standin" "$dir/python/"
  find "$dir/python/vllm_standin" -name __pycache__ -prune -exec rm -rf {} +
fi
rm -f "$dir/stubs.log"

cp "$root/tests/gpu/bundle_run.sh" "$dir/run.sh"
chmod +x "$dir/run.sh"
bytes=$(du -sb "$dir" | awk '{print $1}')
{
  echo "hostkv GPU bundle"
  echo "commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$root" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%FT%TZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -n 1)"
  echo "from: $build"
  echo "size: $((bytes / 1024 / 1024)) MiB ($bytes bytes)"
  (cd "$dir" && du -b bin/* lib/* | sort -k2; [ ! -d python ] || du -sb python)
} > "$dir/MANIFEST"
echo "bundle.sh: wrote $dir: $((bytes / 1024 / 1024)) MiB ($(ls "$dir/bin" | wc -l) binaries, $(ls "$dir/lib" | wc -l) libraries); build $((built - started)) s, packaging $(($(date +%s) - built)) s"
if [ "$bytes" -gt $((64 * 1024 * 1024)) ]; then
  echo "bundle.sh: $dir is over 64 MiB: the device tool cannot carry it" >&2
  exit 1
fi
[ "$bytes" -le $((48 * 1024 * 1024)) ] || echo "bundle.sh: warning: over 48 MiB" >&2
if [ "$check" -eq 1 ]; then
  "$dir/run.sh" --check
fi

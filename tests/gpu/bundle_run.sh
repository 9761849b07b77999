#!/usr/bin/env bash
# run.sh of the GPU bundle (written by tests/gpu/bundle.sh; this is its
# source, tests/gpu/bundle_run.sh). Needs nothing of the machine but bash,
# coreutils, tar and the NVIDIA driver: every binary runs through the
# bundle's own loader and libraries.
#
#   run.sh           on a GPU machine: every GPU test binary, the torch CUDA
#                    check (python/torch_e2e.py, by the machine's python3),
#                    then the signal benchmark and the GPU benchmark; at most
#                    7 minutes on an H200 (each phase under timeout, all under
#                    one deadline). Without a GPU: one line, exit 3.
#   run.sh --check   on any machine: every binary's libraries resolve inside
#                    lib/ (the driver's may be missing) and every binary
#                    starts, in an empty environment (env -i); where python3
#                    has grpcio and protobuf, the bundled hostkv package
#                    imports and torch_e2e.py starts (in python3's own
#                    environment). Exit 0 if so.
#
# Results go to $OUT (default ./gpu-results), at most 4 files:
#   summary.txt  the machine, tests passed/failed/skipped per binary, the
#                benchmark tables, the phases' times (also printed last)
#   gpu_bench.json, gpu_bench.md   the GPU benchmark's results
#   logs.tar.gz  everything else: gtest logs and XML, hostkvd logs, the
#                torch check's log, the signal benchmark's results, machine.txt
# Exit status: 3 without a GPU; 1 when a test failed, timed out or was
# skipped (a skip on a GPU machine counts as a failure) or the torch check
# failed or skipped (no python3 on PATH imports torch with CUDA: on a GPU
# machine that is a failure too);
# else the GPU benchmark's exit status.
set -uo pipefail
# The caller's PATH first (its python3 may be the one with torch), then the
# usual places (nvidia-smi, coreutils).
caller_path=${PATH:-}
export PATH=${caller_path:+$caller_path:}/usr/local/nvidia/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
bundle=$(cd "$(dirname "$0")" && pwd)
loader=$bundle/lib/ld-linux-x86-64.so.2
# In case the copy that carried the bundle lost the mode bits.
[ -x "$loader" ] || chmod +x "$loader" 2>/dev/null

# The python3 for the torch check: the first on PATH (the caller's first)
# that imports torch; else the first with grpcio and protobuf; else the
# first python3 at all. Sets python, python_why (empty, or why it will skip).
pick_python() {
  local dir candidate first="" with_grpc="" seen=":"
  python="" python_why=""
  local IFS=:
  for dir in $PATH; do
    candidate=$dir/python3
    [ -x "$candidate" ] || continue
    case "$seen" in *":$(readlink -f "$candidate"):"*) continue ;; esac
    seen="$seen$(readlink -f "$candidate"):"
    [ -n "$first" ] || first=$candidate
    if timeout 60 "$candidate" -c "import torch" > /dev/null 2>&1; then
      python=$candidate
      return
    fi
    if [ -z "$with_grpc" ] && timeout 30 "$candidate" -c "import grpc, google.protobuf" \
        > /dev/null 2>&1; then
      with_grpc=$candidate
    fi
  done
  python=${with_grpc:-$first}
  if [ -z "$python" ]; then
    python_why="no python3 on PATH"
  else
    python_why="no python3 on PATH imports torch (tried: ${seen//:/ })"
  fi
}

# What the chosen python3 is: its path and its torch, protobuf and grpcio.
python_versions() {
  [ -n "$python" ] || { echo "python3: none"; return; }
  "$python" - <<'PY' 2>&1
import sys
print("python3:", sys.executable, sys.version.split()[0])
for name in ("torch", "google.protobuf", "grpc"):
    try:
        module = __import__(name, fromlist=["__version__"])
        extra = ""
        if name == "torch":
            extra = f" (CUDA {module.version.cuda}, cuda available: {module.cuda.is_available()})"
        print(f"  {name} {getattr(module, '__version__', '?')}{extra}")
    except Exception as e:  # noqa: BLE001
        print(f"  {name}: not importable ({e})")
PY
}

# ---------------------------------------------------------------- --check
# One binary's libraries: every one resolved inside lib/, the driver's may
# be "not found"; prints what is wrong.
check_libraries() {
  local bin=$1 listing line name path bad=0
  if ! listing=$(env -i "$loader" --library-path "$bundle/lib" --list "$bin" 2>&1); then
    echo "FAIL $bin: the loader cannot list it: $listing"
    return 1
  fi
  while read -r line; do
    [ -n "$line" ] || continue
    name=${line%% *}
    case "$line" in
      *" => not found"*)
        case "$name" in libcuda.so*|libnvidia-*) continue ;; esac
        echo "FAIL $(basename "$bin"): $name not found"; bad=1 ;;
      *" => "*)
        path=$(echo "$line" | sed 's/.* => \(.*\) (0x.*/\1/')
        case "$(readlink -f "$path")" in
          "$bundle"/lib/*) ;;
          *) echo "FAIL $(basename "$bin"): $name resolves outside the bundle: $path"; bad=1 ;;
        esac ;;
      linux-vdso.so.*|/lib64/ld-linux-x86-64.so.2*|"$loader"*) ;;  # the loader: ours
      "statically linked") ;;  # a library that needs no other
      *) echo "FAIL $(basename "$bin"): unexpected line: $line"; bad=1 ;;
    esac
  done <<< "$listing"
  return $bad
}

# Runs `bin args` through the loader in an empty environment; it must exit
# with `want` and print something matching `pattern`.
check_starts() {
  local bin=$1 want=$2 pattern=$3 output rc
  shift 3
  output=$(env -i timeout -k 5 30 "$loader" --library-path "$bundle/lib" "$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ] || ! grep -qE "$pattern" <<< "$output"; then
    echo "FAIL $(basename "$bin") $*: exit $rc (want $want), output:"
    head -n 5 <<< "$output" | sed 's/^/    /'
    return 1
  fi
}

# The bundled Python client, where this machine's python3 has what it
# needs (grpcio, protobuf): it imports, and torch_e2e.py starts and stops at
# once (skipped: exit 3; with torch CUDA, no HOSTKVD_BINARY: exit 2).
check_python() {
  local py=$bundle/python f output rc
  local pypath=$py${PYTHONPATH:+:$PYTHONPATH}
  [ -d "$py" ] || { echo "note: no python/ in this bundle: the torch check is left out"; return 0; }
  for f in hostkv/__init__.py hostkv/cuda.py hostkv/_proto/hostkv_pb2.py \
      hostkv/_proto/hostkv_pb2_grpc.py torch_e2e.py torch_e2e_engines.py \
      torch_e2e_sglang.py hostkv_sglang_hook.py hostkv/sglang/host_pool.py \
      torch_e2e_vllm.py vllm_standin/drive.py hostkv/vllm/spec.py; do
    [ -f "$py/$f" ] || { echo "FAIL: python/$f is missing"; return 1; }
  done
  pick_python
  if [ -z "$python" ] || ! "$python" -c "import grpc, google.protobuf" > /dev/null 2>&1; then
    echo "note: no python3 here has grpcio and protobuf: python/ not started"
    return 0
  fi
  # The machine's own python3 in its own environment (it never runs through
  # our loader, so env -i would prove nothing and could hide its packages).
  output=$(env PYTHONPATH="$pypath" PYTHONDONTWRITEBYTECODE=1 timeout 60 \
    "$python" -c "import hostkv, hostkv.cuda, hostkv.torch, hostkv.sglang; print('hostkv', hostkv.pb.DESCRIPTOR.package)" 2>&1)
  if [ "$output" != "hostkv hostkv.v1" ]; then
    echo "FAIL: the bundled hostkv package does not import:"
    tail -n 5 <<< "$output" | sed 's/^/    /'
    return 1
  fi
  output=$(env -u HOSTKVD_BINARY PYTHONPATH="$pypath" PYTHONDONTWRITEBYTECODE=1 timeout 60 \
    "$python" "$py/torch_e2e.py" 2>&1)
  rc=$?
  if { [ "$rc" -ne 3 ] || ! grep -q "^torch_e2e: SKIPPED: " <<< "$output"; } \
      && { [ "$rc" -ne 2 ] || ! grep -q "^torch_e2e: usage" <<< "$output"; }; then
    echo "FAIL: python/torch_e2e.py: exit $rc (want 3, skipped, or 2, usage), output:"
    head -n 5 <<< "$output" | sed 's/^/    /'
    return 1
  fi
}

run_check() {
  local failed=0 bin lib t
  [ -x "$loader" ] || { echo "FAIL: no loader at $loader"; return 1; }
  for bin in "$bundle"/bin/*; do
    check_libraries "$bin" || failed=1
  done
  # The libraries themselves (this also covers those only the driver loads).
  for lib in "$bundle"/lib/*.so*; do
    [ "$lib" = "$loader" ] && continue
    check_libraries "$lib" || failed=1
  done
  check_starts "$bundle/bin/hostkvd" 0 "hostkvd|version" --version || failed=1
  check_starts "$bundle/bin/hostkv_gpu_bench" 0 "hostkv_gpu_bench|version" --version || failed=1
  check_starts "$bundle/bin/hostkv_signal_bench" 0 "usage" --help || failed=1
  [ -s "$bundle/tests.txt" ] || { echo "FAIL: no tests.txt"; failed=1; }
  while read -r t; do
    [ -n "$t" ] || continue
    if [ ! -f "$bundle/bin/$t" ]; then echo "FAIL: $t is in tests.txt, not in bin/"; failed=1; continue; fi
    check_starts "$bundle/bin/$t" 0 '^[A-Za-z0-9_/]+\.$' --gtest_list_tests || failed=1
  done < "$bundle/tests.txt"
  # A test that runs itself again in a child (gpu_transfer_test's killed
  # engine) must find itself under our loader too: its SelfExec tests need
  # no GPU.
  if grep -qx gpu_transfer_test "$bundle/tests.txt"; then
    check_starts "$bundle/bin/gpu_transfer_test" 0 '\[  PASSED  \] 2 tests' \
      --gtest_filter='SelfExec.*' || failed=1
  fi
  check_python || failed=1
  if [ "$failed" -eq 0 ]; then
    echo "bundle check passed: $(ls "$bundle/bin" | wc -l) binaries and $(ls "$bundle/lib" | wc -l) libraries of $bundle resolve inside it and start under env -i"
  else
    echo "bundle check FAILED ($bundle)"
  fi
  return $failed
}

if [ "${1:-}" = "--check" ]; then
  run_check
  exit $?
fi
[ $# -eq 0 ] || { echo "usage: run.sh [--check]" >&2; exit 2; }

# ------------------------------------------------------------- the GPU run
gpu_line=$(timeout -k 2 8 nvidia-smi -L 2>/dev/null | grep -m 1 "^GPU ")
# HOSTKV_BUNDLE_ASSUME_GPU=1 skips this check, to try the phases of this
# script on a machine without a GPU (the tests then skip: counted as failed).
if [ -z "$gpu_line" ] && [ "${HOSTKV_BUNDLE_ASSUME_GPU:-0}" != 1 ] \
    && ! { [ -e /dev/nvidia0 ] && ls /dev/nvidiactl > /dev/null 2>&1; }; then
  echo "run.sh: no GPU here (nvidia-smi -L lists none, no /dev/nvidia0): nothing run"
  exit 3
fi

started=$(date +%s)
deadline=$((started + 420))  # all phases end by then: 7 minutes
OUT=${OUT:-$PWD/gpu-results}
mkdir -p "$OUT"
rm -f "$OUT/summary.txt" "$OUT/gpu_bench.json" "$OUT/gpu_bench.md" "$OUT/logs.tar.gz"
work=$(mktemp -d /tmp/hostkv-gpu-run.XXXXXX)
logs=$work/logs
mkdir -p "$logs/daemon-logs"
phase() { echo "[$(($(date +%s) - started))s] $*" | tee -a "$logs/phases.txt"; }

# The driver's libcuda.so.1: its folder goes after ours on the library path
# (--library-path replaces LD_LIBRARY_PATH), so the driver's libraries load
# and ours win for everything else.
cuda_dir=""
for d in $(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" && /x86-64/ {print $NF}' | xargs -r -n 1 dirname) \
    ${LD_LIBRARY_PATH:+${LD_LIBRARY_PATH//:/ }} /usr/local/nvidia/lib64 /usr/local/nvidia/lib \
    /usr/lib/x86_64-linux-gnu /usr/lib64 /lib/x86_64-linux-gnu /usr/local/cuda/compat; do
  if [ -e "$d/libcuda.so.1" ]; then cuda_dir=$d; break; fi
done
libpath=$bundle/lib${cuda_dir:+:$cuda_dir}
export HOSTKVD_BINARY=$bundle/bin/hostkvd HOSTKVD_LOADER=$loader HOSTKVD_LIBRARY_PATH=$libpath
export HOSTKV_GPU_TEST_LOGS=$logs/daemon-logs

{
  echo "date: $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,persistence_mode \
    --format=csv,noheader
  nvidia-smi | head -n 4 | tail -n 1  # the CUDA version the driver supports
  echo "libcuda.so.1: ${cuda_dir:-not found in the usual places (left to the loader)}"
  echo "kernel: $(uname -r); machine glibc: $(ldd --version 2>/dev/null | head -n 1)"
  echo "cores: $(nproc)"
  free -g | head -n 2
  df -h /dev/shm
  head -n 3 "$bundle/MANIFEST"
  pick_python
  python_versions
  [ -z "$python_why" ] || echo "torch check: $python_why"
} > "$logs/machine.txt" 2>&1  # (a group, not a subshell: python stays set)
machine_line="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1 || echo "$gpu_line"); $(nproc) cores; $(sed -n 2p "$bundle/MANIFEST")"

# hostkvd's pools live in /dev/shm: the tests need ~0.5 GiB, the benchmark
# ~2.5 GiB (it shrinks its transfers to fit). A small /dev/shm is raised
# when we may.
shm_kib=$(df -k --output=size /dev/shm 2>/dev/null | tail -n 1 | tr -d ' ')
if [ "${shm_kib:-0}" -lt $((4 * 1024 * 1024)) ] && [ "$(id -u)" -eq 0 ]; then
  mount -o remount,size=16G /dev/shm >> "$logs/machine.txt" 2>&1 \
    && echo "/dev/shm remounted with 16G" >> "$logs/machine.txt"
fi
ls -d /dev/shm/hostkv* 2>/dev/null | sort > "$work/shm-before"

# One phase: `name limit command...`, through our loader, in its own process
# group (timeout makes one), output to logs/name.log; the group is killed
# afterwards, so no daemon outlives its phase. Sets phase_rc.
current=""
run_phase() {
  local name=$1 limit=$2
  shift 2
  run_limited "$name" "$limit" "$loader" --library-path "$libpath" "$@"
}
# The same for a command of the machine's own (not through our loader).
run_limited() {
  local name=$1 limit=$2 left
  shift 2
  left=$((deadline - $(date +%s)))
  [ "$limit" -le "$left" ] || limit=$left
  if [ "$limit" -lt 5 ]; then
    phase "$name: not run (the run's deadline)"
    phase_rc="not run"
    return
  fi
  phase "$name (limit ${limit}s)"
  timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1 < /dev/null &
  current=$!
  wait "$current"
  phase_rc=$?
  kill -KILL -- "-$current" 2>/dev/null
  current=""
  [ "$phase_rc" -eq 124 ] || [ "$phase_rc" -eq 137 ] && phase_rc="$phase_rc (timed out after ${limit}s)"
}

cleanup_shm() {
  ls -d /dev/shm/hostkv* 2>/dev/null | sort | comm -13 "$work/shm-before" - | xargs -r rm -rf
}
pack() {
  cp "$work"/bench/gpu_bench.json "$work"/bench/gpu_bench.md "$OUT/" 2>/dev/null
  cp -r "$work/bench" "$logs/" 2>/dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$work" logs 2>/dev/null
}
on_signal() {
  [ -n "$current" ] && kill -KILL -- "-$current" 2>/dev/null
  cleanup_shm
  phase "interrupted"
  write_summary
  pack
  exit 130
}
trap on_signal INT TERM

# The counts in a gtest log: "passed failed skipped", from its summary lines.
gtest_counts() {
  local p f s
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -n 1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$1" | tail -n 1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$1" | tail -n 1)
  echo "${p:-?} passed, ${f:-0} failed, ${s:-0} skipped"
}

declare -A test_result
tests_failed=0
version_line="not run"
torch_rc="not run"
torch_line=""
signal_rc="not run"
bench_rc="not run"
write_summary() {
  local t
  {
    echo "== machine: $machine_line"
    echo
    echo "== hostkvd --version (the backend it finds)"
    echo "$version_line"
    echo
    echo "== GPU tests"
    while read -r t; do
      [ -n "$t" ] || continue
      echo "$t: ${test_result[$t]:-not run}"
      grep -hE "^\[  FAILED  \] [A-Za-z]" "$logs/$t.log" 2>/dev/null | sort -u | head -n 20 | sed 's/^/    /'
    done < "$bundle/tests.txt"
    # Why tests skipped, and what they report, from the test logs only.
    sed 's@.*@'"$logs"'/&.log@' "$bundle/tests.txt" | xargs -r grep -h -m 1 "cudaGetDeviceCount" 2>/dev/null | head -n 1
    sed 's@.*@'"$logs"'/&.log@' "$bundle/tests.txt" | xargs -r grep -h "^\[   INFO   \]" 2>/dev/null
    echo
    echo "== torch CUDA end to end (python3 torch_e2e.py): exit code $torch_rc"
    [ -n "$torch_line" ] && echo "$torch_line"
    echo
    echo "== signal latency (hostkv_signal_bench): exit code $signal_rc"
    [ -s "$work/bench/signal_bench.md" ] && cat "$work/bench/signal_bench.md"
    [ "$signal_rc" != 0 ] && [ -s "$logs/signal_bench.log" ] && tail -n 5 "$logs/signal_bench.log"
    echo
    echo "== phases"
    cat "$logs/phases.txt"
    echo
    echo "== GPU benchmark (hostkv_gpu_bench): exit code $bench_rc"
    if [ -s "$work/bench/gpu_bench.md" ]; then
      cat "$work/bench/gpu_bench.md"
    elif [ -s "$logs/gpu_bench.log" ]; then
      tail -n 30 "$logs/gpu_bench.log"
    fi
  } > "$OUT/summary.txt"
}

# What the daemon of the GPU image reports where a driver is (issue 41):
# the CUDA backend, the driver's version and the devices it sees.
run_phase hostkvd_version 15 "$bundle/bin/hostkvd" --version
version_line="$(tail -n 1 "$logs/hostkvd_version.log" 2>/dev/null) (exit $phase_rc)"
if ! grep -qE "backends: cpu, cuda \(CUDA runtime [0-9.]+\); driver [0-9.]+, [1-9][0-9]* device" \
    "$logs/hostkvd_version.log"; then
  version_line="FAIL: a GPU machine and hostkvd finds no driver or device: $version_line"
  tests_failed=1
fi

# Limits in seconds (the deadline also bounds them all): the tests' own
# estimates on an H200 are ~1 minute for gpu_transfer_test, seconds for the
# others; the benchmark skips its remaining cases after --max_seconds.
declare -A limit=([gpu_layout_offsets_test]=30 [gpu_copy_kernels_test]=60 [gpu_transfer_test]=120)
mkdir -p "$work/bench" "$logs/gtest"
while read -r t; do
  [ -n "$t" ] || continue
  run_phase "$t" "${limit[$t]:-60}" "$bundle/bin/$t" --gtest_brief=1 \
    "--gtest_output=xml:$logs/gtest/$t.xml"
  test_result[$t]="$(gtest_counts "$logs/$t.log") (exit $phase_rc)"
  if [ "$phase_rc" != 0 ] || grep -q "^\[  SKIPPED \]" "$logs/$t.log"; then
    tests_failed=1  # a skip with a GPU present counts: see the log for why
  fi
  cleanup_shm
  write_summary
  pack
done < "$bundle/tests.txt"

# The torch check: the python3 that imports torch (pick_python: the
# caller's PATH first) with the bundled hostkv package; hostkvd through our
# loader (HOSTKVD_LOADER). Three engine processes each import torch and make
# a CUDA context: its own deadline is 110 s after its CUDA check, the
# phase's 150 s. On a GPU machine a skip is a failure too (the machine
# should have torch CUDA: a skip means the wrong python3 or no torch).
if [ ! -f "$bundle/python/torch_e2e.py" ]; then
  torch_line="not in this bundle (bundle.sh found no Python stubs)"
elif [ -z "$python" ]; then
  torch_rc=3
  torch_line="torch_e2e: SKIPPED: $python_why"
  tests_failed=1
else
  run_limited torch_e2e 150 env PYTHONPATH="$bundle/python${PYTHONPATH:+:$PYTHONPATH}" \
    PYTHONDONTWRITEBYTECODE=1 HOSTKV_TORCH_E2E_SECONDS=110 \
    "$python" "$bundle/python/torch_e2e.py"
  torch_rc=$phase_rc
  # The verdict, after what the engines said went wrong, and where the time went.
  torch_line=$(grep -E "^torch_e2e( [AB])?: " "$logs/torch_e2e.log" 2>/dev/null \
    | grep -E "^torch_e2e: |FAIL|MISMATCH" | tail -n 7)
  [ -n "$torch_line" ] || torch_line=$(tail -n 3 "$logs/torch_e2e.log" 2>/dev/null)
  torch_line="python3: $python${python_why:+ ($python_why)}"$'\n'"$torch_line"
  [ "$torch_rc" = 0 ] || tests_failed=1  # a skip (3) too, on a GPU machine
fi
cleanup_shm
write_summary
pack

run_phase signal_bench 30 "$bundle/bin/hostkv_signal_bench" --out "$work/bench"
signal_rc=$phase_rc
cleanup_shm
write_summary
pack

bench_limit=130
left=$((deadline - $(date +%s)))
[ "$bench_limit" -le "$left" ] || bench_limit=$left
# The daemon's start and pinning, the MLA model and the report take the rest.
max_seconds=$((bench_limit - 55 > 10 ? bench_limit - 55 : 10))
run_phase gpu_bench "$bench_limit" "$bundle/bin/hostkv_gpu_bench" --out="$work/bench" \
  "--max_seconds=$max_seconds"
bench_rc=$phase_rc
cleanup_shm
phase "done"
write_summary
pack
rm -rf "$work"
cat "$OUT/summary.txt"
[ "$tests_failed" -eq 0 ] || exit 1
[[ "$bench_rc" =~ ^[0-9]+$ ]] && exit "$bench_rc"
exit 1

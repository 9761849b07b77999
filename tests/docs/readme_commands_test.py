#!/usr/bin/env python3
"""Every command block of every README.md runs as written.

    readme_commands_test.py --source=REPO [--only=PATH] [--list]

For each README.md in the repository (git ls-files), in a private
directory and with HOSTKV_TARGET and HOSTKVD_LISTEN pointing to a private
socket there (so commands written against the default socket reach the
test's daemon and no other):

- ```sh blocks run in order in ONE bash process per README (set -euo
  pipefail, cwd = the repository), so variables and background jobs carry
  from block to block; a block that fails fails the test, with its output.
- ```sh runs-until="TEXT": started in the background; the test waits until
  TEXT appears in its output, then goes on (the quickstart, which keeps its
  daemon in the foreground). It is stopped with SIGINT at the end, and
  must then exit 0 (a clean stop).
- ```sh needs=gpu|cluster|docker|grpcurl|systemd|root and
  ```sh not-run="reason": not run; listed with the reason.
- ```python blocks run in order in one interpreter per README (shared
  globals), with build/venv/bin/python (the quickstart's venv), after the
  README's sh blocks have run up to that point.
- Other languages (text, cpp, yaml, proto, json, ...) are not run.

A README whose commands need a daemon starts one in a block (README.md's
quickstart; the others start one unless `hostkv health` finds one).
Daemons and state keepers started under the private directory are stopped
at the end.

Needs the build in REPO/build (the build README's commands name): the test
is skipped (exit 77) when that is not the build under test.
"""
import argparse
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

FENCE = re.compile(r"^```([A-Za-z0-9_+-]*)(.*)$")
ATTR = re.compile(r'([a-z-]+)=("([^"]*)"|\S+)')
RUN_LANGS = {"sh", "python"}
SKIP = 77


class Block:
    def __init__(self, path, line, lang, attrs, text):
        self.path, self.line, self.lang, self.attrs, self.text = path, line, lang, attrs, text

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    def skip_reason(self):
        if "needs" in self.attrs:
            return f"needs {self.attrs['needs']}"
        if "not-run" in self.attrs:
            return f"not run: {self.attrs['not-run']}"
        return None


def parse_blocks(path, text):
    blocks, open_block = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if open_block is None:
            m = FENCE.match(line)
            if m:
                attrs = {a: (q if q is not None and v.startswith('"') else v)
                         for a, v, q in ((g[0], g[1], g[2]) for g in ATTR.findall(m.group(2)))}
                open_block = Block(path, number, m.group(1), attrs, [])
        elif line.startswith("```"):
            open_block.text = "\n".join(open_block.text) + "\n"
            blocks.append(open_block)
            open_block = None
        else:
            open_block.text.append(line)
    if open_block is not None:
        raise SystemExit(f"{path}:{open_block.line}: a code block is never closed")
    return blocks


def lint(block):
    """Problems that make a run block not runnable as written."""
    problems = []
    if block.lang == "sh" and block.skip_reason() is None:
        for n, line in enumerate(block.text.splitlines()):
            if line.startswith("$ "):
                problems.append(f"{block.path}:{block.line + 1 + n}: a '$ ' prompt in a sh "
                                "block (put transcripts in ```text)")
    unknown = set(block.attrs) - {"needs", "not-run", "runs-until"}
    if unknown:
        problems.append(f"{block.where}: unknown block attributes {sorted(unknown)}")
    return problems


PY_DRIVER = r'''
import sys, traceback
blocks = __BLOCKS__
g = {"__name__": "__readme__"}
for where, code in blocks:
    print(f"--- python block {where}", flush=True)
    try:
        exec(compile(code, where, "exec"), g)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: python block {where}", flush=True)
        sys.exit(1)
'''


def build_script(blocks, workdir, python):
    """The bash script running a README's sh and python blocks in order."""
    lines = ["set -euo pipefail", "readme_bg=()",
             "readme_cleanup() { for p in \"${readme_bg[@]}\"; do "
             "kill -INT -- -$p 2>/dev/null || kill -INT $p 2>/dev/null || true; done; }",
             "trap readme_cleanup EXIT"]
    py_batch = []

    def flush_python():
        if not py_batch:
            return
        driver = os.path.join(workdir, f"py_{len(lines)}.py")
        with open(driver, "w") as f:
            f.write(PY_DRIVER.replace("__BLOCKS__", repr(py_batch)))
        lines.append(f"{shlex.quote(python)} {shlex.quote(driver)}")
        py_batch.clear()

    for b in blocks:
        if b.skip_reason() is not None or b.lang not in RUN_LANGS:
            continue
        if b.lang == "python":
            py_batch.append((b.where, b.text))
            continue
        flush_python()
        lines.append(f"echo {shlex.quote('--- sh block ' + b.where)}")
        if "runs-until" in b.attrs:
            log = os.path.join(workdir, f"bg_{b.line}.log")
            body = os.path.join(workdir, f"bg_{b.line}.sh")
            with open(body, "w") as f:
                f.write(b.text)
            text = b.attrs["runs-until"]
            lines += [
                f"setsid bash {shlex.quote(body)} > {shlex.quote(log)} 2>&1 &",
                "readme_bg+=($!)",
                f"for _ in $(seq 1200); do grep -qF -- {shlex.quote(text)} {shlex.quote(log)} "
                f"&& break; kill -0 $! 2>/dev/null || break; sleep 0.5; done",
                f"cat {shlex.quote(log)}",
                f"grep -qF -- {shlex.quote(text)} {shlex.quote(log)} || "
                f"{{ echo {shlex.quote('FAILED: never printed ' + repr(text))}; exit 1; }}"]
        else:
            lines.append(b.text)
    flush_python()
    # Ctrl-C, as the README says, ends every background block, with 0.
    lines += [
        'for p in "${readme_bg[@]}"; do kill -INT -- -$p 2>/dev/null || kill -INT $p; '
        's=0; wait $p || s=$?; echo "--- a runs-until block ended with status $s on Ctrl-C"; '
        '[ $s -eq 0 ] || { echo "FAILED: Ctrl-C did not end it cleanly"; exit 1; }; done',
        "readme_bg=()"]
    return "\n".join(lines) + "\n"


def stop_everything(workdir):
    """Stops every process the README's blocks left (daemons in the
    background, the state keepers they detached): they all carry the
    test's HOSTKV_TARGET in their environment."""
    mark = f"HOSTKV_TARGET=unix:{workdir}/".encode()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if any(e.startswith(mark) for e in env) and int(pid) != os.getpid():
                left.append(int(pid))
                try:
                    os.kill(int(pid), sig)
                except OSError:
                    pass
        if not left:
            return
        time.sleep(1.0)


def run_readme(source, path, blocks, timeout):
    workdir = tempfile.mkdtemp(prefix="hostkv-readme-")
    os.chmod(workdir, 0o755)
    target = f"unix:{workdir}/run/hostkvd.sock"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HOSTKVD_", "HOSTKV_")) and k not in ("PYTHONPATH",)}
    env.update(HOSTKV_TARGET=target, HOSTKVD_LISTEN=target, HOME=workdir)
    python = os.path.join(source, "build", "venv", "bin", "python")
    script = build_script(blocks, workdir, python)
    with open(os.path.join(workdir, "readme.sh"), "w") as f:
        f.write(script)
    try:
        # Output to a file, not a pipe: daemons a block leaves in the
        # background hold it open.
        log_path = os.path.join(workdir, "readme.log")
        with open(log_path, "w") as log:
            run = subprocess.Popen(["bash", os.path.join(workdir, "readme.sh")], cwd=source,
                                   env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
            try:
                code = run.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
                code = 124
        with open(log_path, errors="replace") as log:
            output = log.read()
        if code == 124:
            output += f"\ntimed out after {timeout} s\n"
        return code, output
    finally:
        stop_everything(workdir)
        subprocess.run(["rm", "-rf", workdir], check=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", help="the build under test (skipped unless SOURCE/build)")
    ap.add_argument("--only", action="append", help="README path(s) relative to SOURCE")
    ap.add_argument("--list", action="store_true", help="list the blocks and what is done")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per README")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every README's output")
    a = ap.parse_args()
    source = os.path.realpath(a.source)
    paths = a.only or sorted(p for p in subprocess.run(
        ["git", "ls-files", "README.md", "*/README.md"], cwd=source, capture_output=True,
        text=True, check=True).stdout.split())
    readmes, problems = {}, []
    for path in paths:
        with open(os.path.join(source, path)) as f:
            blocks = parse_blocks(path, f.read())
        readmes[path] = blocks
        for b in blocks:
            problems += lint(b)
    for path, blocks in readmes.items():
        for b in blocks:
            if b.lang in RUN_LANGS:
                print(f"{b.where}: {b.lang}: {b.skip_reason() or 'run'}")
    if problems:
        print("\n".join(["FAIL:"] + problems))
        return 1
    if a.list:
        return 0
    if a.build and os.path.realpath(a.build) != os.path.join(source, "build"):
        print(f"SKIP: the build under test is {a.build}, README's commands use "
              f"{source}/build")
        return SKIP
    failed = []
    for path, blocks in readmes.items():
        if not any(b.lang in RUN_LANGS and b.skip_reason() is None for b in blocks):
            continue
        start = time.monotonic()
        code, output = run_readme(source, path, blocks, a.timeout)
        print(f"== {path}: exit {code} in {time.monotonic() - start:.1f} s")
        if code != 0 or a.verbose:
            print(output[-20000:])
            failed.append(path)
    if failed:
        print(f"FAIL: {', '.join(failed)}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

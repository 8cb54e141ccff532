#!/usr/bin/env bash
# Smoke test of the installers as a new user meets them (run as root on Debian/Ubuntu; needs xvfb,
# util-linux's unshare and the packages' own Depends, which apt installs):
#   1. the .deb: apt-get install it, run `kwker-chat --self-test` under xvfb-run as a fresh user
#      with an empty HOME and no network at all (a network namespace with no interfaces; the Hub
#      and PyPI are out of reach and HF_HUB_OFFLINE is unset; loopback only), check the answer
#      and that the self-test's `kwker serve` answered, check `kwker` on PATH and that `kwker serve`
#      serves the bundled model, then purge the package and check that nothing of it is left outside the user's
#      data, and that the user's data is;
#   2. the tarball: the same from a temporary folder it is extracted into.
#
#   packaging/smoke.sh            # builds what is missing (python packaging/build.py deb --reuse)
#   packaging/smoke.sh --no-build # tests the files in dist/ as they are
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(python3 -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
DEB=dist/kwker_${VERSION}_amd64.deb
TARBALL=dist/kwker-${VERSION}-linux-x86_64.tar.gz
if [[ "${1:-}" != "--no-build" ]]; then
  [[ -f $DEB && -f $TARBALL ]] || python3 packaging/build.py deb --reuse
fi
TESTER=kwker-smoke
id -u $TESTER >/dev/null 2>&1 || useradd --create-home --shell /bin/bash $TESTER
fail() { echo "SMOKE FAILED: $*" >&2; exit 1; }
# Runs a command with no network but loopback (a namespace of its own, its lo brought up).
offline() { unshare --net -- sh -c 'ip link set lo up && exec "$@"' offline "$@"; }

# `kwker serve` ($1: the kwker to run) on the bundled model, offline: one chat completion.
serve_test() {
  local out=/tmp/kwker-smoke-serve.out
  offline runuser -u $TESTER -- env -i HOME="$SMOKE_HOME" PATH=/usr/bin:/bin LANG=C.UTF-8 sh -c \
    "\"$1\" serve Qwen/Qwen2.5-Coder-1.5B-Instruct --port 8765 --max-batch 1 --cache-slots 0 \
      >$out.log 2>&1 & pid=\$!
     for i in \$(seq 120); do
       python3 -c 'import urllib.request as u; u.urlopen(\"http://127.0.0.1:8765/health\")' \
         2>/dev/null && break; sleep 1
     done
     python3 -c 'import json, urllib.request as u; r = u.urlopen(u.Request(
       \"http://127.0.0.1:8765/v1/chat/completions\", json.dumps({\"messages\": [{\"role\":
       \"user\", \"content\": \"What is 2+2?\"}], \"max_tokens\": 16}).encode(),
       {\"Content-Type\": \"application/json\"})); print(r.status,
       json.load(r)[\"choices\"][0][\"message\"][\"content\"])' >$out; kill \$pid" || true
  cat "$out" 2>/dev/null
  grep -q "^200 .*4" "$out" || { tail -20 "$out.log"; fail "$1 serve did not answer"; }
}

# Runs the self-test as the tester with an empty HOME, offline; prints its output.
self_test() {  # $1: the kwker-chat to run
  local home
  home=$(mktemp -d /tmp/kwker-smoke-home.XXXX)
  chown $TESTER: "$home"
  local started=$SECONDS
  offline runuser -u $TESTER -- env -i HOME="$home" PATH=/usr/bin:/bin LANG=C.UTF-8 \
    xvfb-run -a -s "-screen 0 1280x800x24" "$1" --self-test 2>&1 | tee /tmp/kwker-smoke.out
  echo "(the self-test took $((SECONDS - started)) s)"
  grep -q "^answer: .*4" /tmp/kwker-smoke.out || fail "$1: the answer does not say 4"
  grep -q "^serve: 200, .*4" /tmp/kwker-smoke.out || fail "$1: kwker serve did not answer"
  grep -q "^self-test passed" /tmp/kwker-smoke.out || fail "$1: the self-test did not pass"
  [[ -z "$(find "$home/.cache" -name '*.kwk' 2>/dev/null)" ]] || fail "$1 packed weights at first launch"
  SMOKE_HOME=$home
}

echo "== the .deb: $DEB ($(du -h "$DEB" | cut -f1))"
apt-get install -y -q "./$DEB" >/tmp/kwker-smoke-apt.log || { tail -20 /tmp/kwker-smoke-apt.log; fail "apt-get install"; }
mapfile -t FILES < <(dpkg -L kwker)
command -v kwker-chat >/dev/null && command -v kwker >/dev/null || fail "kwker and kwker-chat are not on PATH"
self_test kwker-chat
runuser -u $TESTER -- env -i HOME="$SMOKE_HOME" PATH=/usr/bin:/bin kwker --help | grep -q "usage: kwker" \
  || fail "kwker --help"
serve_test kwker
echo "something of the user's" >"$SMOKE_HOME/keep.txt"
apt-get purge -y -q kwker >/dev/null
left=()
for f in "${FILES[@]}"; do
  # folders the package shares with others (/usr, /usr/share/icons/...) stay: only its own go
  [[ -e "$f" && ! -d "$f" ]] && left+=("$f")
done
[[ -e /opt/kwker ]] && left+=(/opt/kwker)
((${#left[@]} == 0)) || fail "purging left: ${left[*]:0:10}"
[[ -f "$SMOKE_HOME/keep.txt" ]] || fail "purging touched the user's files"
echo "purged: nothing of the package is left; the user's data is"

echo "== the tarball: $TARBALL ($(du -h "$TARBALL" | cut -f1))"
place=$(mktemp -d /tmp/kwker-portable.XXXX)
tar -xzf "$TARBALL" -C "$place"
chmod -R a+rX "$place"
self_test "$place/kwker/kwker-chat"
rm -rf "$place"
echo "SMOKE PASSED"

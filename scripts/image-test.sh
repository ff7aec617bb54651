#!/usr/bin/env bash
# Build the container image from the Dockerfile and smoke-test it, on a machine without a
# Docker engine:
#   bash scripts/image-test.sh
#
# - The base: when debian:bookworm-slim is not in podman's storage, a Debian 12 minbase root
#   filesystem is made with debootstrap (from this machine's Debian mirror) and imported as
#   localhost/debian:bookworm-slim.
# - The build: podman build --isolation chroot --network host. The CPU torch wheel comes from
#   the wheel directory pip is configured with (PIP_FIND_LINKS) when it holds one, and the
#   llama-cpp-python wheel from scripts/setup.sh's cache (~/.cache/chatbox/wheels/<flavour>)
#   when it holds one for the image's CMAKE_ARGS; otherwise the build downloads / compiles them.
# - The smoke test: `podman run` needs cgroups this kernel lacks, so the image's filesystem is
#   mounted (podman image mount) and its own entrypoint and `chatbox serve` run in a chroot as
#   the image's non-root user, data in a temporary directory, on a loopback port: /readyz
#   ready, a streamed answer from /v1/chat/completions, the admin password read from a secret
#   file (and not in the logs), a conversation kept across a restart of the server.
# Exits non-zero on any failure; prints the image size and what takes it.
#
# Environment: CHATBOX_IMAGE (default localhost/chatbox:test), DEBIAN_MIRROR (default: this
# machine's apt sources), TORCH_WHEELS (a directory holding the torch wheel), CHATBOX_WHEEL_CACHE
# (as for scripts/setup.sh), IMAGE_TEST_BUILD_ARGS (extra `podman build` arguments).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  exec sudo --preserve-env=CHATBOX_IMAGE,DEBIAN_MIRROR,TORCH_WHEELS,CHATBOX_WHEEL_CACHE,IMAGE_TEST_BUILD_ARGS,PIP_FIND_LINKS,PIP_CERT,SSL_CERT_FILE,HOME \
    bash "$0" "$@"
fi

IMAGE="${CHATBOX_IMAGE:-localhost/chatbox:test}"
BUILD_LOG="${IMAGE_TEST_BUILD_LOG:-/tmp/chatbox-image-build.log}"
BASE=localhost/debian:bookworm-slim
TORCH_VERSION=2.13.0
T0=$(date +%s)

say() { printf '\033[1m== %s\033[0m  (+%ss)\n' "$*" "$(( $(date +%s) - T0 ))"; }
fail() { printf '\033[1;31mFAIL: %s\033[0m\n' "$*" >&2; exit 1; }
problem() {  # a failure that does not stop the test; the script fails at the end
  printf '\033[1;31mPROBLEM: %s\033[0m\n' "$*" >&2
  echo "$*" >>"$PROBLEMS"
}

# -- cleanup: the server, the mounts, the image mount, the temporary directory ---------------
SERVER_PID=""
MNT=""
WORK=""
MOUNTS=()
cleanup() {
  local rc=$?
  set +e
  stop_server
  local i
  for (( i=${#MOUNTS[@]}-1; i>=0; i-- )); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount -l "${MOUNTS[i]}"
  done
  [ -n "$MNT" ] && podman image unmount "$IMAGE" >/dev/null
  if [ $rc != 0 ] && [ -n "$WORK" ] && [ -f "$WORK/server.log" ]; then
    echo "---- server log (last 60 lines) ----" >&2
    tail -n 60 "$WORK/server.log" >&2
  fi
  [ -n "$WORK" ] && rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null
    local i
    for i in $(seq 1 60); do
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
      echo "server did not stop on SIGTERM in 30 s; killing it" >&2
      kill -KILL "$SERVER_PID" 2>/dev/null
    fi
  fi
  wait "$SERVER_PID" 2>/dev/null || true  # 143: uvicorn re-raises SIGTERM after a clean stop
  SERVER_PID=""
}

# -- tools ----------------------------------------------------------------------------------
if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null; then
  say "installing podman and debootstrap"
  apt-get update -qq && apt-get install -y -qq podman debootstrap >/dev/null
fi

# -- the base image ---------------------------------------------------------------------------
debian_mirror() {
  if [ -n "${DEBIAN_MIRROR:-}" ]; then echo "$DEBIAN_MIRROR"; return; fi
  local f m=""
  for f in /etc/apt/sources.list.d/*.sources; do  # deb822 stanzas: URIs + Suites
    [ -f "$f" ] || continue
    m=$(awk '
      function flush() { if (u != "" && s) { print u; found = 1; exit } u = ""; s = 0 }
      /^[ \t]*$/ { flush(); next }
      /^URIs:/ { u = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == "bookworm") s = 1 }
      END { if (!found) flush() }' "$f")
    [ -n "$m" ] && break
  done
  if [ -z "$m" ]; then  # one-line style: deb [options] URI bookworm ...
    m=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | sed -E 's/\[[^]]*\]//' | awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }')
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

if ! podman image exists "$BASE"; then
  mirror=$(debian_mirror)
  say "making $BASE with debootstrap from $mirror"
  rootfs=$(mktemp -d /var/tmp/chatbox-rootfs.XXXXXX)
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 \
    || { tail -n 20 "$rootfs.log" >&2; rm -rf "$rootfs" "$rootfs.log"; fail "debootstrap"; }
  rm -f "$rootfs.log"
  # Slim like Docker Hub's debian:bookworm-slim: no documentation, manuals or translations now
  # or from later installs, no package caches or lists.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  echo 'Acquire::Languages "none";' >"$rootfs/etc/apt/apt.conf.d/docker-no-languages"
  find "$rootfs/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  rm -rf "$rootfs"/usr/share/{man,groff,info,lintian,linda,locale}/* \
         "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
         "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/* "$rootfs/etc/resolv.conf" \
         "$rootfs/etc/hostname"
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then  # the same mirrors as this machine
    grep -v '^#' /etc/apt/sources.list.d/debian.sources >"$rootfs/etc/apt/sources.list.d/debian.sources"
    rm -f "$rootfs/etc/apt/sources.list"
  fi
  tar -C "$rootfs" --numeric-owner -c . \
    | podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - "$BASE" >/dev/null
  rm -rf "$rootfs"
fi

# -- the build --------------------------------------------------------------------------------
# --format docker: the OCI format has no HEALTHCHECK. --pull=never: the Dockerfile's short name
# debian:bookworm-slim resolves to the local $BASE.
BUILD=(--format docker --isolation chroot --network host --layers --pull=never -t "$IMAGE")
torch_dir=""
for d in ${TORCH_WHEELS:-} ${PIP_FIND_LINKS:-} $(pip3 config get global.find-links 2>/dev/null || true); do
  d="${d#file://}"
  if compgen -G "$d/torch-$TORCH_VERSION*-cp311-*manylinux*x86_64.whl" >/dev/null; then
    torch_dir="$d"; break
  fi
done
if [ -n "$torch_dir" ]; then
  BUILD+=(-v "$(realpath "$torch_dir"):/wheels/torch:ro" --build-arg TORCH_FIND_LINKS=/wheels/torch)
  echo "torch $TORCH_VERSION (CPU) from $torch_dir"
fi
wheel_cache="${CHATBOX_WHEEL_CACHE:-$HOME/.cache/chatbox/wheels}"
# the Dockerfile's default CMAKE_ARGS are scripts/llama-wheel.sh's
flavour=$(CMAKE_ARGS= bash "$(dirname "$0")/llama-wheel.sh" flavour)
if compgen -G "$wheel_cache/$flavour/llama_cpp_python-*.whl" >/dev/null; then
  BUILD+=(-v "$(realpath "$wheel_cache"):/wheels/llama:ro" --build-arg LLAMA_WHEEL_DIR=/wheels/llama)
  echo "llama-cpp-python prebuilt from $wheel_cache/$flavour"
else
  echo "llama-cpp-python: no cached wheel in $wheel_cache/$flavour; the build compiles it"
fi
# This machine's CA bundle for pip and npm in the build (it may sit behind a TLS-intercepting
# proxy whose CA the base image's bundle lacks); the build stages only, not the final image.
ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
if [ -f "$ca" ]; then
  BUILD+=(-v "$(realpath "$ca"):/etc/ssl/build-ca.pem:ro"
          --build-arg PIP_CERT=/etc/ssl/build-ca.pem --build-arg NODE_EXTRA_CA_CERTS=/etc/ssl/build-ca.pem)
fi
# shellcheck disable=SC2206
BUILD+=(${IMAGE_TEST_BUILD_ARGS:-})
say "building $IMAGE (the full log: $BUILD_LOG)"
# The steps on the console, everything in the log.
set +e
podman build "${BUILD[@]}" . 2>&1 | tee "$BUILD_LOG" \
  | grep --line-buffered -E '^\[[0-9]+/[0-9]+\] (STEP|COMMIT)|^llama-cpp-python:|Using cache'
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" != 0 ]; then tail -n 40 "$BUILD_LOG" >&2; fail "podman build"; fi
say "built $IMAGE"

# -- what the image declares ------------------------------------------------------------------
CONFIG=$(podman image inspect "$IMAGE")
python3 - "$CONFIG" <<'EOF' || fail "image configuration"
import json, sys
img = json.loads(sys.argv[1])[0]
cfg = img["Config"]
env = dict(e.split("=", 1) for e in cfg.get("Env", []))
user = cfg.get("User", "")
problems = []
if user.split(":")[0] in ("", "0", "root"):
    problems.append(f"runs as root (User={user!r})")
if env.get("CHATBOX_HOST") != "0.0.0.0":
    problems.append(f"CHATBOX_HOST={env.get('CHATBOX_HOST')!r}, not 0.0.0.0")
if env.get("CHATBOX_DATA_DIR") != "/data" or "/data" not in (cfg.get("Volumes") or {}):
    problems.append("data not in the /data volume")
if "8000/tcp" not in (cfg.get("ExposedPorts") or {}):
    problems.append("port 8000 not exposed")
health = img.get("Healthcheck") or img.get("HealthCheck") or cfg.get("Healthcheck") or {}
if "/readyz" not in " ".join(health.get("Test") or []):
    problems.append(f"no HEALTHCHECK on /readyz ({health})")
for p in problems:
    print("image:", p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
readarray -t IMAGE_ENV < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
readarray -t ENTRYPOINT < <(podman image inspect --format '{{range .Config.Entrypoint}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
readarray -t CMD < <(podman image inspect --format '{{range .Config.Cmd}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
IMAGE_USER=$(podman image inspect --format '{{.Config.User}}' "$IMAGE")

# -- the image's filesystem: size and contents ------------------------------------------------
MNT=$(podman image mount "$IMAGE")
say "image filesystem at $MNT"
size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
echo "image size: $(( size / 1024 / 1024 )) MiB"
echo "-- largest directories (MiB):"
{
  du -xms "$MNT"/* 2>/dev/null
  du -xms "$MNT"/opt/venv/lib/python3*/site-packages/* "$MNT"/usr/lib/x86_64-linux-gnu \
          "$MNT"/usr/lib/python3* "$MNT"/app 2>/dev/null
} | sed "s|$MNT||" | sort -rn | sed -n '1,20p'  # sed reads it all: no SIGPIPE under pipefail
echo "-- layers:"
podman history --format '{{.Size}}\t{{.CreatedBy}}' "$IMAGE" | cut -c1-110 | sed -n '1,14p'

for tool in gcc cc g++ c++ cmake make npm node nodejs; do
  [ ! -e "$MNT/usr/bin/$tool" ] || fail "the image carries a build tool: /usr/bin/$tool"
done
for cache in root/.cache root/.npm home/chatbox/.cache tmp/llama; do
  [ ! -e "$MNT/$cache" ] || fail "the image carries a build cache: /$cache"
done
! compgen -G "$MNT/var/lib/apt/lists/*_Packages*" >/dev/null || fail "the image carries apt lists"
! compgen -G "$MNT/var/cache/apt/archives/*.deb" >/dev/null || fail "the image carries .deb files"
SITE=$(echo "$MNT"/opt/venv/lib/python3*/site-packages)
if ls "$SITE" | grep -i '^nvidia'; then fail "CUDA packages (nvidia-*) in the CPU image"; fi
torch_version=$(sed -n 's/^Version: //p' "$SITE"/torch-*.dist-info/METADATA)
case "$torch_version" in
  *+cpu) echo "torch $torch_version" ;;
  *) fail "torch $torch_version is not the CPU build" ;;
esac

# -- a place to run it: proc, dev, sys; data, tmp and the secret in a temp dir ------------------
WORK=$(mktemp -d /tmp/chatbox-image-test.XXXXXX)
chmod 0755 "$WORK"
UIDGID="$IMAGE_USER"
[[ "$UIDGID" == *:* ]] || UIDGID="$UIDGID:$UIDGID"
mkdir -p "$WORK/data" "$WORK/tmp"
chown "$UIDGID" "$WORK/data"
chmod 1777 "$WORK/tmp"
ADMIN_PASSWORD="image-test-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')"
printf '%s\n' "$ADMIN_PASSWORD" >"$WORK/tmp/admin_password"
chown "$UIDGID" "$WORK/tmp/admin_password"
chmod 0400 "$WORK/tmp/admin_password"

bind() {  # bind SRC DEST [ro]
  mount --bind "$1" "$MNT$2"
  MOUNTS+=("$MNT$2")
  if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$MNT$2"; fi
}
mount -t proc proc "$MNT/proc"; MOUNTS+=("$MNT/proc")
# A container's /dev: a few device nodes and a private /dev/shm, nothing else of this machine's.
mount -t tmpfs -o mode=0755,nosuid tmpfs "$MNT/dev"; MOUNTS+=("$MNT/dev")
for node in null zero full random urandom tty; do
  touch "$MNT/dev/$node"
  bind "/dev/$node" "/dev/$node"
done
mkdir "$MNT/dev/shm"
mount -t tmpfs -o mode=1777,nosuid,nodev,size=64m tmpfs "$MNT/dev/shm"; MOUNTS+=("$MNT/dev/shm")
ln -s /proc/self/fd "$MNT/dev/fd"
bind /sys /sys ro
bind "$WORK/tmp" /tmp
bind "$WORK/data" /data

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BASE_URL="http://127.0.0.1:$PORT"
CHROOT=$(command -v chroot)
# The image's environment, but on a loopback port: the chroot shares this machine's network.
RUN_ENV=("${IMAGE_ENV[@]}" HOME=/home/chatbox CHATBOX_HOST=127.0.0.1 CHATBOX_PORT="$PORT"
         CHATBOX_ADMIN_PASSWORD_FILE=/tmp/admin_password TINI_SUBREAPER=1)

in_image() {  # run a command in the image as its user, with the image's environment
  env -i "${RUN_ENV[@]}" "$CHROOT" --userspec="$UIDGID" "$MNT" "$@"
}

start_server() {
  echo "---- start $(date -u +%FT%TZ)" >>"$WORK/server.log"
  env -i "${RUN_ENV[@]}" "$CHROOT" --userspec="$UIDGID" "$MNT" "${ENTRYPOINT[@]}" "${CMD[@]}" \
    </dev/null >>"$WORK/server.log" 2>&1 &
  SERVER_PID=$!
  local i
  # a first start trains moderation's classifiers before it says ready
  for i in $(seq 1 480); do
    kill -0 "$SERVER_PID" 2>/dev/null || fail "the server exited during start-up"
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE_URL/readyz")" = 200 ]; then
      say "ready: $(curl -s "$BASE_URL/readyz")"
      return 0
    fi
    sleep 1
  done
  fail "/readyz not ready after 480 s"
}

cat >"$WORK/client.py" <<'EOF'
"""The smoke test's HTTP client (standard library only)."""
import http.client, json, os, re, sys, urllib.parse

BASE = urllib.parse.urlsplit(sys.argv[1])

def request(method, path, body=None, headers=None):
    conn = http.client.HTTPConnection(BASE.hostname, BASE.port, timeout=180)
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    hdrs = {"Content-Type": "application/json"} if isinstance(body, (dict, list)) else {}
    conn.request(method, path, body=data, headers={**hdrs, **(headers or {})})
    resp = conn.getresponse()
    resp.connection = conn  # the socket closes when the connection is collected
    return resp

def sse(resp):
    """(event, data) pairs of a text/event-stream response."""
    event, data = None, []
    for raw in resp:
        line = raw.decode().rstrip("\r\n")
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())

def check(ok, what):
    if not ok:
        sys.exit(f"client: {what}")

def problem(what):
    """A failure that does not stop the test: reported, and the script fails at the end."""
    print(f"PROBLEM: {what}", file=sys.stderr)
    with open(os.environ["PROBLEMS"], "a") as f:
        print(what, file=f)

cmd, args = sys.argv[2], sys.argv[3:]
if cmd == "stream":  # one streamed answer from the OpenAI-compatible API
    key = args[0]
    resp = request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Say hello in one short sentence."}],
        "stream": True, "max_tokens": 24}, {"Authorization": f"Bearer {key}"})
    if resp.status != 200:
        check(False, f"chat/completions: HTTP {resp.status} {resp.read()[:300]!r}")
    ctype = resp.getheader("content-type", "")
    if not ctype.startswith("text/event-stream"):
        problem(f"/v1/chat/completions streams with Content-Type {ctype!r}, not text/event-stream")
    text, chunks, done = [], 0, False
    for _, data in sse(resp):
        if data == "[DONE]":
            done = True
            break
        chunk = json.loads(data)
        chunks += 1
        for choice in chunk.get("choices", []):
            text.append((choice.get("delta") or {}).get("content") or "")
    answer = "".join(text)
    check(done, "the stream did not end with [DONE]")
    check(chunks >= 2 and answer.strip(), f"no streamed answer ({chunks} chunks, {answer!r})")
    print(f"streamed answer ({chunks} chunks, model {resp.getheader('x-chatbox-model')}): "
          f"{answer.strip()!r}")
elif cmd == "login":  # the admin password from the secret file logs in
    name, password = args
    page = request("GET", "/login")
    html = page.read().decode()
    cookie = page.getheader("set-cookie", "").split(";")[0]
    token = re.search(r'name="csrf_token" value="([^"]+)"', html)
    check(page.status == 200 and token and cookie, "no login form")
    form = urllib.parse.urlencode({"name": name, "password": password,
                                   "csrf_token": token.group(1), "next": "/"})
    resp = request("POST", "/login", form.encode(), {
        "Content-Type": "application/x-www-form-urlencoded", "Cookie": cookie})
    resp.read()
    check(resp.status == 303 and "chatbox_session" in (resp.getheader("set-cookie") or ""),
          f"admin login: HTTP {resp.status}")
    print(f"admin {name!r} logs in with the password")
elif cmd == "converse":  # a conversation with one exchanged turn; prints its id
    key = args[0]
    auth = {"Authorization": f"Bearer {key}"}
    resp = request("POST", "/v1/conversations", {"title": "kept across a restart"}, auth)
    body = resp.read()
    check(resp.status == 201, f"create conversation: HTTP {resp.status} {body[:300]!r}")
    conv = json.loads(body)["id"]
    resp = request("POST", f"/v1/conversations/{conv}/turns",
                   {"content": "Remember the word: marmalade."}, auth)
    if resp.status != 200:
        check(False, f"send turn: HTTP {resp.status} {resp.read()[:300]!r}")
    ctype = resp.getheader("content-type", "")
    if not ctype.startswith("text/event-stream"):
        problem(f"/v1/conversations/…/turns streams with Content-Type {ctype!r}")
    kinds = [event for event, _ in sse(resp)]
    check(kinds and kinds[0] == "start" and kinds[-1] == "done" and "token" in kinds,
          f"turn stream events: {kinds[:5]}…{kinds[-3:]}")
    print(conv)
elif cmd == "recall":  # the conversation and its turns are still there
    key, conv = args
    resp = request("GET", f"/v1/conversations/{conv}", None, {"Authorization": f"Bearer {key}"})
    body = resp.read()
    check(resp.status == 200, f"read conversation after restart: HTTP {resp.status} {body[:300]!r}")
    view = json.loads(body)
    roles = [(t["role"], t["status"]) for t in view["turns"]]
    check(view["title"] == "kept across a restart", f"title {view['title']!r}")
    check(any(t["role"] == "user" and "marmalade" in t["content"] for t in view["turns"]),
          f"the user's turn is gone: {roles}")
    check(any(t["role"] == "assistant" and t["content"].strip() for t in view["turns"]),
          f"the answer is gone: {roles}")
    print(f"conversation {conv} kept across the restart: {roles}")
else:
    sys.exit(f"client: unknown command {cmd}")
EOF
export PROBLEMS="$WORK/problems"
: >"$PROBLEMS"
client() { python3 "$WORK/client.py" "$BASE_URL" "$@"; }

# -- the smoke test ---------------------------------------------------------------------------
say "first start: chatbox serve in the image as $UIDGID on 127.0.0.1:$PORT"
start_server
in_image chatbox users add smoke --tier free --no-password >>"$WORK/server.log" 2>&1 \
  || fail "chatbox users add"
KEY=$(in_image chatbox keys create --user smoke --name image-test 2>>"$WORK/server.log") \
  || fail "chatbox keys create"
[[ "$KEY" == cbx-* ]] || fail "unexpected API key ${KEY:0:8}…"
client stream "$KEY" || fail "streamed answer"
client login admin "$ADMIN_PASSWORD" || fail "admin login with the password from CHATBOX_ADMIN_PASSWORD_FILE"
CONV=$(client converse "$KEY") || fail "conversation"
echo "conversation $CONV: one turn answered"

say "restart"
stop_server
start_server
client recall "$KEY" "$CONV" || fail "conversation after restart"
stop_server

say "first start with no admin password given: generated, in a 0600 file, not in the log"
RUN_ENV=("${IMAGE_ENV[@]}" HOME=/home/chatbox CHATBOX_HOST=127.0.0.1 CHATBOX_PORT="$PORT"
         CHATBOX_DATA_DIR=/data/fresh TINI_SUBREAPER=1)
start_server
pwfile="$WORK/data/fresh/admin-password.txt"
if [ -f "$pwfile" ]; then
  mode=$(stat -c %a "$pwfile")
  [ "$mode" = 600 ] || problem "/data/fresh/admin-password.txt has mode $mode, not 600"
  GENERATED=$(head -n 1 "$pwfile")
  client login admin "$GENERATED" || fail "admin login with the generated password"
  ! grep -qF "$GENERATED" "$WORK/server.log" || problem "the generated admin password is in the log"
else
  problem "no admin-password.txt in the data directory; the server said: $(grep -i 'admin account' "$WORK/server.log" | tail -n 1 | sed -E 's/(password: ).*/\1<redacted>/')"
fi
stop_server

! grep -qF "$ADMIN_PASSWORD" "$WORK/server.log" || fail "the admin password is in the server's output"
! grep -qF "$KEY" "$WORK/server.log" || fail "the API key is in the server's output"
owners=$(find "$WORK/data" -not -uid "${UIDGID%%:*}" | head -n 3)
[ -z "$owners" ] || fail "files in /data not owned by the image's user: $owners"
echo "-- /data after the test:"
(cd "$WORK/data" && du -ahd2 . | sort -k2 | head -n 20)
if [ -s "$PROBLEMS" ]; then
  sed 's/^/  - /' "$PROBLEMS" >&2
  fail "the image works, with the problems above"
fi
say "image test passed: $IMAGE, $(( size / 1024 / 1024 )) MiB"

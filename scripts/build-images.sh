#!/usr/bin/env bash
# Build the Flotilla images here, with no Docker engine: buildah (chroot isolation) FROM a local
# Debian bookworm base made with debootstrap, and export them as OCI archives.
#
#   scripts/build-images.sh                 # both images, then OCI archives in $OUT_DIR
#   scripts/build-images.sh engine          # only one (engine | operator | base)
#   EXPORT=0 scripts/build-images.sh        # build and tag only
#   FORCE=1 scripts/build-images.sh         # rebuild even when the inputs are unchanged
#
# An image whose label dev.flotilla.inputs equals the hash of what goes into it (Containerfile,
# constraints, pyproject, sources, base image, torch wheel) is not rebuilt, and its archive is not
# re-exported: a second run with nothing changed takes seconds.
#
# Tags: ghcr.io/flotilla-dev/flotilla-engine:$VERSION-cpu (the CPU flavour; the CUDA flavour, built
# elsewhere with the same Containerfile, is :$VERSION) and ghcr.io/flotilla-dev/flotilla-operator:$VERSION,
# VERSION from pyproject.toml. Archives: $OUT_DIR/flotilla-{engine-$VERSION-cpu,operator-$VERSION}.oci.tar
# (load with `podman load -i FILE` or `skopeo copy oci-archive:FILE docker://...`).
#
# Environment: SRC_DIR (the checkout to build; default this script's), FLOTILLA_IMAGES_CACHE (default ~/.cache/flotilla-images: the base rootfs tarball),
# OUT_DIR (default $FLOTILLA_IMAGES_CACHE/oci), TORCH_WHEEL (the CPU torch wheel mounted into the
# engine build; default the one in /opt/wheels), DEBIAN_MIRROR, EXPORT (1), BUILDAH_LAYERS (true:
# reuse cached layers, so a rebuild after a source edit only redoes the last steps).
set -euo pipefail
cd "${SRC_DIR:-$(dirname "$0")/..}"
CACHE=${FLOTILLA_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flotilla-images}
OUT_DIR=${OUT_DIR:-$CACHE/oci}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_WHEEL=${TORCH_WHEEL:-$(ls /opt/wheels/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -n1)}
EXPORT=${EXPORT:-1}
FORCE=${FORCE:-0}
export BUILDAH_LAYERS=${BUILDAH_LAYERS:-true}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n1)
REGISTRY=ghcr.io/flotilla-dev
BASE=localhost/flotilla-base:bookworm
ENGINE=$REGISTRY/flotilla-engine:$VERSION-cpu
OPERATOR=$REGISTRY/flotilla-operator:$VERSION
# What the base holds: Python 3.11 with venv (the builders' pip) and the CA store (openssl with it).
BASE_PACKAGES=python3,python3-venv,ca-certificates
# The host's CA bundle: pip inside the build reaches the index through the same TLS proxy, if any.
HOST_CA=/etc/ssl/certs/ca-certificates.crt

log() { printf '\n== %s\n' "$*" >&2; }

system_deps() {
  command -v buildah >/dev/null && command -v debootstrap >/dev/null && return 0
  log "installing buildah and debootstrap (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah debootstrap >/dev/null
}

# The debootstrap rootfs, made once and kept as a tarball; imported FROM scratch as $BASE.
base() {
  local tarball=$CACHE/bookworm-minbase-${BASE_PACKAGES//,/-}.tar
  if [ ! -s "$tarball" ]; then
    log "debootstrap bookworm ($BASE_PACKAGES) -> $tarball (~1 min)"
    mkdir -p "$CACHE"
    local root
    root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$root" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log" >&2; rm -rf "$root"; return 1; }
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    tar --numeric-owner -C "$root" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  # Re-import when the tarball is newer than the image (or the image is missing).
  local stamp=$CACHE/base-image.id want
  want=$(sha256sum "$tarball" | cut -c1-16)
  if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && buildah inspect --type image "$BASE" >/dev/null 2>&1; then
    return 0
  fi
  log "importing the base image $BASE"
  local ctx
  ctx=$(mktemp -d)
  ln "$tarball" "$ctx/rootfs.tar" 2>/dev/null || cp "$tarball" "$ctx/rootfs.tar"
  printf 'FROM scratch\nADD rootfs.tar /\nCMD ["/bin/bash"]\n' > "$ctx/Containerfile"
  buildah bud --isolation chroot --layers=false -q -t "$BASE" "$ctx" >/dev/null
  rm -rf "$ctx"
  echo "$want" > "$stamp"
}

inputs_hash() {  # inputs_hash CONTAINERFILE [extra words]: what the build of that file reads
  {
    echo "$*"; buildah inspect --type image --format '{{.FromImageID}}' "$BASE"
    find "$1" images/requirements-*.txt images/containerignore pyproject.toml README.md flotilla engine kernels \
      operator -type f ! -path '*/__pycache__/*' ! -name '*.pyc' 2>/dev/null | LC_ALL=C sort | xargs sha256sum
  } | sha256sum | cut -c1-16
}

label_of() {  # label_of IMAGE: its dev.flotilla.inputs label, or nothing
  buildah inspect --type image --format '{{index .OCIv1.Config.Labels "dev.flotilla.inputs"}}' "$1" 2>/dev/null || true
}

bud() {  # bud IMAGE CONTAINERFILE [extra buildah args]: build unless an image of the same inputs exists
  local image=$1 file=$2; shift 2
  local hash
  hash=$(inputs_hash "$file" "$@")
  if [ "$FORCE" != 1 ] && [ "$(label_of "$image")" = "$hash" ]; then
    echo "up to date: $image (inputs $hash)" >&2; return 0
  fi
  local ca=()
  [ -f "$HOST_CA" ] && ca=(-v "$HOST_CA:/host-ca.crt:ro" --build-arg PIP_CERT=/host-ca.crt)
  log "building $image from $file"
  local t0=$SECONDS
  buildah bud --isolation chroot --pull=false --build-arg BASE_IMAGE="$BASE" --build-arg VERSION="$VERSION" \
    --label dev.flotilla.inputs="$hash" --ignorefile images/containerignore "${ca[@]}" "$@" \
    -f "$file" -t "$image" .
  echo "built $image in $((SECONDS - t0)) s" >&2
}

engine() {
  [ -f "$TORCH_WHEEL" ] || { echo "no CPU torch wheel at '$TORCH_WHEEL' (set TORCH_WHEEL)" >&2; return 1; }
  bud "$ENGINE" images/engine.Containerfile \
    -v "$(dirname "$TORCH_WHEEL"):/wheels:ro" --build-arg TORCH_INDEX=/wheels
}

operator() {
  bud "$OPERATOR" images/operator.Containerfile
}

export_archive() {  # export_archive IMAGE FILE: unless FILE holds this very image already
  [ "$EXPORT" = 1 ] || return 0
  mkdir -p "$OUT_DIR"
  local id stamp=$OUT_DIR/.$2.id
  id=$(buildah inspect --type image --format '{{.FromImageID}}' "$1")
  if [ "$FORCE" != 1 ] && [ -s "$OUT_DIR/$2" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$id" ]; then
    echo "up to date: $OUT_DIR/$2" >&2; return 0
  fi
  log "exporting $1 -> $OUT_DIR/$2"
  local t0=$SECONDS
  rm -f "$OUT_DIR/$2" "$stamp"
  buildah push -q "$1" "oci-archive:$OUT_DIR/$2:$1"
  echo "$id" > "$stamp"
  echo "exported $OUT_DIR/$2 ($(du -m "$OUT_DIR/$2" | cut -f1) MB) in $((SECONDS - t0)) s" >&2
}

main() {
  local what=${1:-all}
  system_deps
  base
  case $what in
    base) ;;
    engine) engine; export_archive "$ENGINE" "flotilla-engine-$VERSION-cpu.oci.tar" ;;
    operator) operator; export_archive "$OPERATOR" "flotilla-operator-$VERSION.oci.tar" ;;
    all)
      operator; engine
      export_archive "$OPERATOR" "flotilla-operator-$VERSION.oci.tar"
      export_archive "$ENGINE" "flotilla-engine-$VERSION-cpu.oci.tar" ;;
    *) echo "usage: $0 [all|engine|operator|base]" >&2; return 2 ;;
  esac
  buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -E "flotilla-(engine|operator)|flotilla-base" >&2 || true
}

main "$@"

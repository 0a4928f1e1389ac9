#!/usr/bin/env bash
# Makes the Debian 12 base image of muonshard's runtime images from Debian's
# packages, without any image registry: `debootstrap --variant=minbase
# bookworm` from a Debian mirror into a scratch directory, trimmed (no .debs,
# apt lists, documentation), then `podman import`. Prints the image's name.
#
#   deploy/images/base-image.sh [--mirror URL] [--security URL]
#
# Cached by content: the tag is the first 16 hex digits of the SHA-256 of this
# script and the mirror URLs (localhost/muonshard/debian:bookworm-<key>); an
# existing image of that tag is reused. The mirror defaults to
# $MUONSHARD_DEBIAN_MIRROR, else the first URI of the host's APT sources that
# serves bookworm, else http://deb.debian.org/debian; the image's APT sources
# are that mirror's bookworm + bookworm-updates and the security archive
# (--security, $MUONSHARD_DEBIAN_SECURITY, the host's, or
# http://deb.debian.org/debian-security), so `apt-get install` in a
# Dockerfile works as on debian:bookworm-slim. Needs root (debootstrap).
set -euo pipefail

SUITE=bookworm
mirror=${MUONSHARD_DEBIAN_MIRROR:-}
security=${MUONSHARD_DEBIAN_SECURITY:-}
while (($#)); do
  case "$1" in
    --mirror) mirror=${2:?--mirror needs a URL}; shift 2 ;;
    --security) security=${2:?--security needs a URL}; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "base-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# URIs of the host's APT sources for a suite (deb822 .sources and one-line
# sources.list), first match first.
host_uri() {
  local suite=$1 f
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    awk -v s="$suite" '
      /^[ \t]*$/ { if (uri != "" && ok) { print uri; exit } uri = ""; ok = 0; next }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) ok = 1 }
      END { if (uri != "" && ok) print uri }' "$f" | head -n1
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f "$f" ]] || continue
    awk -v s="$suite" '$1 == "deb" { for (i = 2; i < NF; i++) if ($i !~ /^\[/ && $(i + 1) == s) { print $i; exit } }' "$f"
  done
}
[[ -n "$mirror" ]] || mirror=$(host_uri "$SUITE" | head -n1)
[[ -n "$mirror" ]] || mirror=http://deb.debian.org/debian
[[ -n "$security" ]] || security=$(host_uri "$SUITE-security" | head -n1)
[[ -n "$security" ]] || security=http://deb.debian.org/debian-security

for tool in podman debootstrap; do
  if ! command -v "$tool" >/dev/null; then
    echo "base-image: $tool is not installed (apt-get install podman debootstrap)" >&2
    exit 1
  fi
done

key=$( (cat "$0"; echo "$mirror $security") | sha256sum | cut -c1-16)
image=localhost/muonshard/debian:$SUITE-$key
if podman image exists "$image"; then
  echo "base-image: $image exists (cached)" >&2
  echo "$image"
  exit 0
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "base-image: debootstrap needs root" >&2
  exit 1
fi

root=$(mktemp -d "${TMPDIR:-/tmp}/muonshard-base.XXXXXX")
trap 'rm -rf "$root"' EXIT
echo "base-image: debootstrap --variant=minbase $SUITE from $mirror" >&2
start=$SECONDS
if ! debootstrap --variant=minbase "$SUITE" "$root/rootfs" "$mirror" >"$root/debootstrap.log" 2>&1; then
  tail -n 30 "$root/debootstrap.log" >&2
  echo "base-image: debootstrap failed (log above)" >&2
  exit 1
fi
rfs=$root/rootfs
cat >"$rfs/etc/apt/sources.list" <<SOURCES
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
deb $security $SUITE-security main
SOURCES
# As Debian's slim images: no recommends, no caches of downloaded packages.
cat >"$rfs/etc/apt/apt.conf.d/90muonshard" <<'APT'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
APT
cat >"$rfs/etc/dpkg/dpkg.cfg.d/90muonshard-nodoc" <<'DPKG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
DPKG
rm -rf "$rfs"/var/cache/apt/archives/*.deb "$rfs"/var/cache/apt/*.bin "$rfs"/var/lib/apt/lists/* \
  "$rfs"/var/log/* "$rfs"/usr/share/man/* "$rfs"/usr/share/info/* "$rfs"/usr/share/locale/* \
  "$rfs"/tmp/* "$rfs"/var/tmp/* "$rfs"/debootstrap
find "$rfs/usr/share/doc" -mindepth 2 ! -name copyright ! -type d -delete 2>/dev/null || true
: >"$rfs/etc/hostname"
: >"$rfs/etc/resolv.conf"
echo "base-image: importing ($((SECONDS - start)) s so far)" >&2
tar -C "$rfs" --numeric-owner -c . |
  podman import --change 'CMD ["bash"]' --change 'ENV LANG=C.UTF-8' \
    --message "debootstrap --variant=minbase $SUITE $mirror" - "$image" >/dev/null
echo "base-image: $image made in $((SECONDS - start)) s" >&2
echo "$image"

#!/usr/bin/env bash
# Prints the packages (dpkg) that own the shared libraries the given binaries
# load, one per line, sorted: the runtime package list of an image that runs
# them on the same distribution. Used in the worker image's GPU build stage,
# by the build stages of the Debian images to check their fixed lists, and by
# tests/deploy (deploy_images) against the binaries built in the tree.
#
#   deploy/docker/runtime-packages.sh BINARY...
#
# Exit 1, naming the library, when the loader cannot find one (ldd "not
# found") or no installed package owns it; 2 on bad usage.
set -euo pipefail

if (($# == 0)); then
  echo "usage: $0 BINARY..." >&2
  exit 2
fi

# Every library path ldd resolves, once.
declare -A libs=()
status=0
for bin in "$@"; do
  if [[ ! -f "$bin" ]]; then
    echo "runtime-packages: $bin: no such file" >&2
    exit 1
  fi
  ldd_out=$(ldd "$bin") || { echo "runtime-packages: ldd $bin failed" >&2; exit 1; }
  while read -r line; do
    # "libfoo.so.1 => /path/libfoo.so.1 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)",
    # "linux-vdso.so.1 (0x...)", "libbar.so.2 => not found".
    if [[ "$line" == *"=> not found"* ]]; then
      echo "runtime-packages: $bin: ${line%% *} not found by the loader" >&2
      status=1
    elif [[ "$line" == *" => /"* ]]; then
      path=${line#* => }
      libs[${path%% (*}]=1
    elif [[ "$line" == /* ]]; then
      libs[${line%% (*}]=1
    fi
  done <<<"$ldd_out"
done
((status == 0)) || exit 1

# Candidate paths of each library: as ldd printed it, its real path, and the
# other side of the /usr merge (dpkg records /lib/... on Debian 12 and
# /usr/lib/... on newer releases).
declare -A candidates=()
all=()
for lib in "${!libs[@]}"; do
  real=$(readlink -f "$lib")
  list=("$lib" "$real")
  for p in "$lib" "$real"; do
    case "$p" in
      /usr/lib/* | /usr/lib64/*) list+=("${p#/usr}") ;;
      /lib/* | /lib64/*) list+=("/usr$p") ;;
    esac
  done
  candidates[$lib]="${list[*]}"
  all+=("${list[@]}")
done

# One dpkg-query for all of them (each call reads the whole file database).
# Lines are "pkg[:arch][, pkg2...]: /path"; diversions start "diversion by".
declare -A owner=()
while IFS= read -r line; do
  [[ "$line" == "diversion by"* || "$line" != *": /"* ]] && continue
  pkgs=${line%%: /*}
  path=/${line#*: /}
  pkg=${pkgs%%,*}
  owner[$path]=${pkg%%:*}
done < <(dpkg-query -S "${all[@]}" 2>/dev/null || true)

declare -A packages=()
for lib in "${!libs[@]}"; do
  found=""
  for p in ${candidates[$lib]}; do
    if [[ -n "${owner[$p]:-}" ]]; then
      found=${owner[$p]}
      break
    fi
  done
  if [[ -z "$found" ]]; then
    echo "runtime-packages: $lib is owned by no installed package" >&2
    status=1
  else
    packages[$found]=1
  fi
done
((status == 0)) || exit 1
printf '%s\n' "${!packages[@]}" | sort

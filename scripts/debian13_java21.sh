#!/usr/bin/env bash
# A Java 21 runtime for running the suite on Java 21 on a Debian 12 machine, which packages none:
# Debian 13's openjdk-21-jre-headless with Debian 13's C library (it needs glibc 2.38; Debian 12
# has 2.36), unpacked into DIR (default .cache/java21) and started through that library's loader.
# Prints the JAVA_HOME to use:  JAVA_HOME=$(scripts/debian13_java21.sh) make test
# Only for testing the product on Java 21; a machine with its own Java 21 needs none of this.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(realpath -m "${1:-.cache/java21}")
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
packages="openjdk-21-jre-headless libc6 libstdc++6 libgcc-s1 zlib1g"
home="$dir/jdk"
libs="$dir/root/usr/lib/x86_64-linux-gnu"

if [ ! -x "$home/bin/java.real" ]; then
  mkdir -p "$dir/debs" "$dir/root"
  curl -fsSL --retry 3 "$mirror/dists/trixie/main/binary-amd64/Packages.xz" | xz -d >"$dir/Packages"
  for p in $packages; do
    file=$(awk -v p="$p" '$0 == "Package: " p {f = 1} f && /^Filename:/ {print $2; exit}' "$dir/Packages")
    [ -n "$file" ] || { echo "debian13_java21: $p is not in Debian 13's index" >&2; exit 1; }
    curl -fsSL --retry 3 -o "$dir/debs/$p.deb" "$mirror/$file"
    dpkg-deb -x "$dir/debs/$p.deb" "$dir/root"
  done
  rm -rf "$home"
  cp -a "$dir/root/usr/lib/jvm/java-21-openjdk-amd64" "$home"
  # Debian points some of the runtime's files to /etc/java-21-openjdk: point them into the unpacked tree
  find "$home" -type l | while read -r link; do
    target=$(readlink "$link")
    case "$target" in /*) [ -e "$dir/root$target" ] && ln -sfn "$dir/root$target" "$link" ;; esac
  done
  # the two executables Java starts (the launcher, and the helper that spawns processes) run
  # through Debian 13's loader with its libraries
  for exe in bin/java lib/jspawnhelper; do
    mv "$home/$exe" "$home/$exe.real"
    printf '#!/bin/sh\nexec %s --library-path %s:%s/lib:%s/lib/server %s "$@"\n' \
      "$libs/ld-linux-x86-64.so.2" "$libs" "$home" "$home" "$home/$exe.real" >"$home/$exe"
    chmod +x "$home/$exe"
  done
fi
"$home/bin/java" -version >/dev/null 2>&1 || { echo "debian13_java21: $home/bin/java does not start" >&2; exit 1; }
echo "$home"

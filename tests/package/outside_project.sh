#!/usr/bin/env bash
# Builds examples/standalone, a project outside baton's tree, the way a user would, and runs it
# against the test database (DATABASE_URL): a node with a handler, a Client, the job handled.
#   outside_project.sh BUILD_DIR SOURCE_DIR find_package   cmake --install, then find_package
#   outside_project.sh BUILD_DIR SOURCE_DIR pkg-config     cmake --install, then pkg-config
#   outside_project.sh BUILD_DIR SOURCE_DIR fetchcontent   FetchContent from the checkout
set -euo pipefail
build=$1 source=$2 mode=$3
work=$(mktemp -d /tmp/baton-outside.XXXXXX)
trap 'rm -rf "$work"' EXIT
schema="outside_$$_$RANDOM"
export PATH=/usr/bin:/bin:$PATH
case "$mode" in
  find_package|pkg-config)
    cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
    echo "installed into a temporary prefix: $(find "$work/prefix" -type f | wc -l) files"
    ;;
esac
case "$mode" in
  find_package)
    cmake -S "$source/examples/standalone" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log"
    cmake --build "$work/build" >"$work/build.log" || { cat "$work/build.log"; exit 1; }
    program="$work/build/standalone"
    ;;
  pkg-config)
    pc=$(dirname "$(find "$work/prefix" -name baton.pc)")
    # shellcheck disable=SC2046
    g++ -O1 -o "$work/standalone" "$source/examples/standalone/main.cpp" \
      $(PKG_CONFIG_PATH="$pc" pkg-config --cflags --libs baton)
    program="$work/standalone"
    ;;
  fetchcontent)
    # A unity build, as a project that builds its dependencies in batches would: baton's sources
    # must compile together too (scripts/package compiles each on its own), and it takes 80 s
    # here against 132 s file by file.
    cmake -S "$source/examples/standalone" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_UNITY_BUILD=ON -DBATON_SOURCE="$source" >"$work/configure.log"
    cmake --build "$work/build" >"$work/build.log" || { cat "$work/build.log"; exit 1; }
    if grep -q -- "-Werror" "$work/build/build.ninja"; then
      echo "baton's -Werror leaked into a consumer's build" >&2
      exit 1
    fi
    program="$work/build/standalone"
    ;;
  *) echo "outside_project.sh: unknown mode '$mode'" >&2; exit 2 ;;
esac
"$program" "$schema"
psql "$DATABASE_URL" -XAtq -c "DROP SCHEMA $schema CASCADE" >/dev/null 2>&1 || true

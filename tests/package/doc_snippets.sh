#!/usr/bin/env bash
# Every C++ snippet of README.md and docs/*.md compiles against the installed library and runs:
# each ```cpp block is a whole program. It runs against a database of its own (created here on
# the test server): a program that ends by itself must exit 0 within 20 s; one that serves (a
# node) must lead, then exit 0 on SIGTERM.
#   doc_snippets.sh BUILD_DIR SOURCE_DIR      (DATABASE_URL: the test server)
set -euo pipefail
build=$1 source=$2
work=$(mktemp -d /tmp/baton-snippets.XXXXXX)
db="snippets_$$_$RANDOM"
admin_url=$DATABASE_URL
cleanup() {
  jobs -p | xargs -r kill -9 2>/dev/null || true
  psql "$admin_url" -XAtq -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

cmake --install "$build" --prefix "$work/prefix" >/dev/null
mkdir -p "$work/project"
# Extract: each ```cpp block becomes snippet_<n>.cpp; snippets.txt says where it came from.
: >"$work/snippets.txt"
n=0
for doc in "$source/README.md" "$source"/docs/*.md; do
  awk -v out="$work/project" -v list="$work/snippets.txt" -v doc="${doc#"$source"/}" -v start="$n" '
    /^```cpp$/ { inside = 1; start++; file = sprintf("%s/snippet_%d.cpp", out, start);
                 printf "snippet_%d %s:%d\n", start, doc, NR >> list; next }
    /^```$/ && inside { inside = 0; close(file); next }
    inside { print > file }
    END { print start > (out "/.count") }' "$doc"
  n=$(cat "$work/project/.count")
done
echo "$n snippets:"
sed 's/^/  /' "$work/snippets.txt"
{
  echo "cmake_minimum_required(VERSION 3.25)"
  echo "project(snippets LANGUAGES CXX)"
  echo "find_package(baton REQUIRED)"
  for i in $(seq 1 "$n"); do
    echo "add_executable(snippet_$i snippet_$i.cpp)"
    echo "target_link_libraries(snippet_$i PRIVATE baton::baton)"
  done
} >"$work/project/CMakeLists.txt"
cmake -S "$work/project" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
if ! cmake --build "$work/build" -- -k 0 >"$work/build.log" 2>&1; then
  grep -E "snippet_[0-9]+\.cpp:[0-9]+:[0-9]+: error" "$work/build.log" | head -n 20 | while read -r line; do
    id=$(echo "$line" | grep -oE "snippet_[0-9]+" | head -n 1)
    echo "$(grep "^$id " "$work/snippets.txt" | cut -d' ' -f2): $line"
  done
  echo "some snippets do not compile" >&2
  exit 1
fi

psql "$admin_url" -XAtq -c "CREATE DATABASE $db" >/dev/null
url=$(echo "$admin_url" | sed -E "s#/[^/?]*(\?|$)#/$db\1#")
status=0
for i in $(seq 1 "$n"); do
  where=$(grep "^snippet_$i " "$work/snippets.txt" | cut -d' ' -f2)
  log="$work/snippet_$i.log"
  DATABASE_URL="$url" "$work/build/snippet_$i" >"$log" 2>&1 &
  pid=$!
  result=""
  for _ in $(seq 1 200); do  # up to 20 s
    if ! kill -0 "$pid" 2>/dev/null; then
      if wait "$pid"; then result="ran and exited 0"; else result="FAILED: exit $?"; fi
      break
    fi
    if grep -q "leadership GRANTED" "$log"; then
      kill -TERM "$pid"
      if wait "$pid"; then result="led, then stopped on SIGTERM (exit 0)"; else result="FAILED: exit $? after SIGTERM"; fi
      break
    fi
    sleep 0.1
  done
  if [ -z "$result" ]; then
    kill -9 "$pid" 2>/dev/null || true
    result="FAILED: neither ended nor led within 20 s"
  fi
  echo "snippet_$i ($where): $result"
  case "$result" in FAILED*) status=1; tail -n 20 "$log" ;; esac
done
[ $status = 0 ] && echo "every snippet compiles and runs"
exit $status

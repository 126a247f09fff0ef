#!/bin/sh
# Fails when a tracked C++ file differs from what clang-format (the repository's .clang-format)
# makes of it. Exit 77 (skipped) where clang-format or git is missing.
#   tests/format/check_format.sh SOURCE_DIR
cd "$1" || exit 1
command -v clang-format >/dev/null 2>&1 || { echo "clang-format not installed: skipped"; exit 77; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "not a git checkout: skipped"; exit 77; }
list=$(mktemp)
report=$(mktemp)
trap 'rm -f "$list" "$report"' EXIT
git ls-files '*.cpp' '*.hpp' '*.h' '*.cc' | grep -v '^tests/fixtures/data/' | while read -r f; do
  [ -f "$f" ] && echo "$f"
done > "$list"
[ -s "$list" ] || exit 0
# Many files per clang-format process, two processes at once: each file that would change gets
# "FILE:LINE:COL: error: code should be clang-formatted" lines on stderr.
xargs -P 2 -n 40 clang-format --dry-run --Werror < "$list" > /dev/null 2> "$report" || true
bad=$(sed -n 's/^\([^:]*\):[0-9]*:[0-9]*: error: code should be clang-formatted.*/\1/p' "$report" | sort -u)
if [ -n "$bad" ]; then
  echo "not clang-formatted (run: clang-format -i FILE):"
  for f in $bad; do echo "  $f"; done
  exit 1
fi
# Anything else clang-format said (a file it could not read or parse) is a failure too.
if grep -q . "$report"; then
  cat "$report"
  exit 1
fi
echo "$(wc -l < "$list") files formatted"

#!/bin/sh
# Fails when a tracked C++ file differs from what clang-format (the repository's .clang-format)
# makes of it. Exit 77 (skipped) where clang-format or git is missing.
#   tests/format/check_format.sh SOURCE_DIR
cd "$1" || exit 1
command -v clang-format >/dev/null 2>&1 || { echo "clang-format not installed: skipped"; exit 77; }
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || { echo "not a git checkout: skipped"; exit 77; }
files=$(git ls-files '*.cpp' '*.hpp' '*.h' '*.cc' | grep -v '^tests/fixtures/data/')
[ -n "$files" ] || exit 0
bad=""
for f in $files; do
  [ -f "$f" ] || continue
  clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad="$bad $f"
done
if [ -n "$bad" ]; then
  echo "not clang-formatted (run: clang-format -i FILE):"
  for f in $bad; do echo "  $f"; done
  exit 1
fi
echo "$(echo "$files" | wc -l) files formatted"

#!/usr/bin/env bash
# The length of every function in src/ (lines from its signature to its closing brace, measured by
# universal-ctags), the longest first, and the limits the code keeps: no function in src/train over
# 80 lines (the trainer reads top to bottom), none in src/ over 150. Exits 1, naming each function
# over its limit. Run by ctest (function_lengths).
#   bash scripts/function_lengths.sh [--top N]
set -euo pipefail
cd "$(dirname "$0")/.."
top=15
[ "${1:-}" = --top ] && top=$2
command -v ctags > /dev/null || { echo "function_lengths: universal-ctags is not installed (scripts/install-deps.sh)"; exit 1; }
lengths=$(ctags -x --_xformat="%{line} %{end} %{input} %{name}" --kinds-c++=f --language-force=C++ -R src |
  awk '$2 != "" { print $2 - $1 + 1, $3 ":" $1, $4 }' | sort -rn)
echo "longest functions in src/ (lines, where, name):"
head -n "$top" <<<"$lengths" | sed 's/^/  /'
over=$(awk '($2 ~ /^src\/train\// && $1 > 80) || $1 > 150 { print "  " $0 }' <<<"$lengths")
if [ -n "$over" ]; then
  echo "function_lengths: over the limit (80 lines in src/train, 150 in src/):"
  echo "$over"
  exit 1
fi
echo "function_lengths: every function in src/train within 80 lines, in src/ within 150"

#!/usr/bin/env bash
# tools/update_readme_flags.sh — rewrites README.md's flag list from ./train_gpt2 --help,
# so the README never disagrees with the binary.
set -eu
cd "$(dirname "$0")/.."
help=$(./train_gpt2 --help | sed -n 's/^  --/--/p')
python3 - "$help" <<'PY'
import re, sys
help_lines = sys.argv[1].splitlines()
block = "```\n" + "\n".join(help_lines) + "\n```\n"
s = open("README.md").read()
start = s.index("## Flags\n")
end = s.index("\n## ", start + 1)
s = s[:start] + "## Flags\n\n`./train_gpt2 --help` prints the same list with defaults in brackets. Flags also take the\nform `--flag=value`.\n\n" + block + s[end:]
open("README.md", "w").write(s)
PY

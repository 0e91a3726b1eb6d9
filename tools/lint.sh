#!/usr/bin/env bash
# Lint: ruff (lint + format check) on the Python code, clang-format on the CUDA headers, mypy on
# replayssm/. Fast (seconds); .ci/run runs it before the tests and .pre-commit-config.yaml runs the
# same tools on commit. Needs the pinned tools: pip install -e '.[lint]'
#
#   bash tools/lint.sh          check only (exit 1 on any finding)
#   bash tools/lint.sh --fix    apply ruff's fixes and both formatters, then check
#
# The Jinja templates (jit_templates/*.jinja) are not C++, so clang-format skips them; it formats
# include/**/*.cuh and *.h with the style in .clang-format.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

fix=0
[[ ${1:-} == --fix ]] && fix=1

mapfile -t headers < <(find include -type f \( -name '*.cuh' -o -name '*.h' \) | sort)
failed=()
run() {  # run NAME CMD...: print a header, run, remember a failure
    local name=$1; shift
    printf '\n--- %s\n' "$name"
    if "$@"; then echo "ok"; else failed+=("$name"); fi
}

for tool in ruff clang-format mypy; do
    command -v "$tool" >/dev/null || { echo "lint: $tool not found (pip install -e '.[lint]')" >&2; exit 2; }
done

if (( fix )); then
    ruff check --fix .
    ruff format .
    clang-format -i "${headers[@]}"
fi
run "ruff check" ruff check --output-format concise .
run "ruff format --check" ruff format --check --output-format concise .
run "clang-format (${#headers[@]} headers)" clang-format --dry-run -Werror "${headers[@]}"
run "mypy replayssm" mypy

if (( ${#failed[@]} )); then
    printf '\nlint: FAILED: %s\n' "$(IFS=,; echo "${failed[*]}")"
    exit 1
fi
printf '\nlint: all checks passed\n'

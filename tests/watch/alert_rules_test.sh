#!/usr/bin/env bash
# promtool check rules RULES, then promtool test rules TESTS (which names the
# rules file by its base name, so both are run from one folder).
#   alert_rules_test.sh RULES TESTS
set -euo pipefail
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cp "$1" "$2" "$dir/"
cd "$dir"
promtool check rules "$(basename "$1")"
promtool test rules "$(basename "$2")"

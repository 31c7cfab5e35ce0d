#!/usr/bin/env bash
# The main job: installs what is missing, builds everything, and prints the
# event routing table by routing one event of every type through a Registry.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //...
bazel run //tools:routing_table

#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs the demo against a
# soft-RoCE device (in the test VM when this kernel has no rdma_rxe), with
# ibev-watch beside it. Every event type is shown with the handler that heard
# it; the exit status says whether each reached exactly the right one.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel build //examples/demo:demo //apps/ibev_watch:ibev-watch
bin=$(bazel info bazel-bin 2>/dev/null)
exec tools/softroce/softroce_run.sh -- examples/demo/run_demo.sh \
  "$bin/examples/demo/demo" "$bin/apps/ibev_watch/ibev-watch"

#!/usr/bin/env python3
"""What one `bazel test` run gave, read from its build event protocol file
(--build_event_json_file), not from Bazel's human summary.

    bazel_results.py EVENTS_JSON BAZEL_EXIT [--keep-logs DIR] [--no-tests-ok]

Prints a line per test target, "//label: passed (N runs)" or "//label: failed
(F of N runs); log: PATH" (the first failing run's test.log, copied into DIR
with --keep-logs), a line per target that did not build, and last a line
"totals: TARGETS_PASSED TARGETS_FAILED RUNS RUNS_FAILED" for the caller.
A target passes when every run of it passed (a cached pass is a pass). A
Bazel exit other than 0 with no failed target counts as one failure (a build
error, an interrupted run), except 4 (no test matched) with --no-tests-ok.
"""
import json
import os
import shutil
import sys
from urllib.parse import unquote, urlparse


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    keep_logs = None
    if "--keep-logs" in argv:
        keep_logs = argv[argv.index("--keep-logs") + 1]
        args.remove(keep_logs)
    no_tests_ok = "--no-tests-ok" in argv
    events_path, bazel_exit = args[0], int(args[1])

    runs = {}  # label -> [runs, failed runs, first failing log]
    unbuilt = []
    try:
        with open(events_path) as events:
            for line in events:
                event = json.loads(line)
                ident = event.get("id", {})
                if "testResult" in ident and "testResult" in event:
                    label = ident["testResult"]["label"]
                    entry = runs.setdefault(label, [0, 0, None])
                    entry[0] += 1
                    if event["testResult"].get("status") != "PASSED":
                        entry[1] += 1
                        if entry[2] is None:
                            entry[2] = test_log(event["testResult"])
                elif "targetCompleted" in ident:
                    built = "aborted" not in event and event.get("completed", {}).get(
                        "success", False)
                    if not built:
                        unbuilt.append(ident["targetCompleted"]["label"])
    except FileNotFoundError:
        pass  # Bazel stopped before writing any: its exit code says so

    passed = failed = total_runs = failed_runs = 0
    for label in sorted(runs):
        count, failures, log = runs[label]
        total_runs += count
        failed_runs += failures
        if failures == 0:
            passed += 1
            print(f"{label}: passed ({count} run{'s' if count != 1 else ''})")
            continue
        failed += 1
        if log and keep_logs:
            os.makedirs(keep_logs, exist_ok=True)
            kept = os.path.join(keep_logs, label.strip("/").replace("/", "_").replace(":", "_") +
                                ".log")
            try:
                shutil.copyfile(log, kept)
                log = kept
            except OSError:
                pass
        print(f"{label}: failed ({failures} of {count} runs); log: {log or 'none'}")
    for label in sorted(set(unbuilt) - set(runs)):
        failed += 1
        print(f"{label}: did not build")
    if failed == 0 and bazel_exit != 0 and not (bazel_exit == 4 and no_tests_ok):
        failed = 1
        print(f"bazel exited {bazel_exit} with no failed target")
    print(f"totals: {passed} {failed} {total_runs} {failed_runs}")


def test_log(result):
    for output in result.get("testActionOutput", []):
        if output.get("name") == "test.log":
            return unquote(urlparse(output["uri"]).path)
    return None


if __name__ == "__main__":
    main(sys.argv)

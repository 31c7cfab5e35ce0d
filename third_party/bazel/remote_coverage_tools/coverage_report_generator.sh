#!/bin/sh
echo "coverage_report_generator: offline stand-in, no report merged" >&2
exit 0

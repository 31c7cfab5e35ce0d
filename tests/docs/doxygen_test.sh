#!/usr/bin/env bash
# The API reference (issue #27): Doxygen makes it from the public headers'
# comments without a single warning (docs/doxygen/doxygen.sh runs it with
# warnings as errors), from exactly the headers of PUBLIC_HEADERS, and the
# comments land where a reader looks: a header's opening comment is its file's
# description and its class's, member comments document their members (and
# overloads below), trailing comments their enumerators and fields, examples
# are code, and <ibev/...> in a comment is text, not a lost HTML tag.
#
#   doxygen_test.sh DOXYGEN_SH DOXYFILE VERSION_H PUBLIC_HEADER...
set -uo pipefail
doxygen_sh=$1 doxyfile=$2 version_h=$3
shift 3
headers=("$@")
if ! command -v doxygen >/dev/null; then
  echo "FAILED: doxygen is not installed (apt-get install doxygen, or tools/setup.sh)"
  exit 1
fi

passed=0 failed=0
expect() {  # expect NAME CONDITION...
  local name=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAILED: $name"; fi
}

# The Doxyfile's INPUT is PUBLIC_HEADERS (as ibev/...), neither more nor less.
listed=$(sed -n '/^INPUT *=/,/[^\\]$/p' "$doxyfile" | sed 's/^INPUT *=//; s/\\$//' |
  tr -s ' ' '\n' | sed -n 's|^ibev/||p' | sort)
expected=$(printf '%s\n' "${headers[@]#./}" | sort)  # ./ibev.h: the root package's
expect "the Doxyfile's INPUT is PUBLIC_HEADERS (missing: $(comm -13 <(echo "$listed") \
<(echo "$expected") | paste -sd' '); extra: $(comm -23 <(echo "$listed") <(echo "$expected") |
  paste -sd' '))" test "$listed" = "$expected"

scratch=${TEST_TMPDIR:-$(mktemp -d)}

# The filter's rules, one each, on a sample header: the opening comment is the
# file's (and its subject class's), "e.g. " does not end the brief, < and >
# are text outside code spans and quotes, an example is code, an enumerator's
# trailing comment is its own (both lines), a comment documents the
# declaration below and its overload but not the copy constructor, a note
# before a blank line and a comment in a body stay comments; line for line.
mkdir -p "$scratch/ibev"
cat >"$scratch/ibev/sample.h" <<'HEADER'
// ibev::Sample: what it is, e.g. a sample.
//
// With <b>, `<ibev/core/handle.h>` and "<what>".
//
//   ibev::Sample sample(1);  // an example
//
// After the example.
#ifndef IBEV_SAMPLE_H_
#define IBEV_SAMPLE_H_

namespace ibev {

enum class Kind {
  kOne,  // the first
         // on two lines
  kTwo,
};

class Sample {
 public:
  // Makes one.
  Sample();
  explicit Sample(int n);
  Sample(const Sample&) = delete;

  // A note, not a member's.

  int get() const {
    // Inside a body.
    return 0;
  }
};

}  // namespace ibev

#endif  // IBEV_SAMPLE_H_
HEADER
cat >"$scratch/sample.expected" <<'FILTERED'
/// ibev::Sample: what it is, e.g.\ a sample. \file
///
/// With &lt;b&gt;, `<ibev/core/handle.h>` and "<what>".
/// \code{.cpp}
///  ibev::Sample sample(1);  // an example
/// \endcode
/// After the example.
#ifndef IBEV_SAMPLE_H_
#define IBEV_SAMPLE_H_

namespace ibev {

enum class Kind {
  kOne,  ///< the first
         ///< on two lines
  kTwo,
};

/** \copydoc sample.h */ class Sample {
 public:
  /// Makes one.
  Sample();
  /** Makes one. */ explicit Sample(int n);
  Sample(const Sample&) = delete;

  // A note, not a member's.

  int get() const {
    // Inside a body.
    return 0;
  }
};

}  // namespace ibev

#endif  // IBEV_SAMPLE_H_
FILTERED
python3 "$(dirname "$doxygen_sh")/comment_filter.py" "$scratch/ibev/sample.h" >"$scratch/sample.filtered"
expect "the filter's rules on a sample header" \
  diff -u "$scratch/sample.expected" "$scratch/sample.filtered"
out=$scratch/reference
rm -rf "$out"
log=$scratch/doxygen.log
bash "$doxygen_sh" "$out" >"$log" 2>&1
status=$?
expect "doxygen.sh succeeds with no warning (exit $status)" test "$status" -eq 0
expect "doxygen.sh prints nothing" test ! -s "$log"
[[ -s $log ]] && sed 's/^/  | /' "$log"
html=$out/html
expect "the reference has an index" test -f "$html/index.html"

# A page's text, tags dropped, entities decoded, white space collapsed.
text() {
  python3 - "$1" <<'PY'
import html, re, sys
page = open(sys.argv[1], encoding="utf-8").read()
page = re.sub(r"(?s)<script.*?</script>", " ", page)
page = re.sub(r"</?(a|b|code|em|span|strong|tt)\b[^>]*>", "", page)  # inline: no space
print(re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page))))
PY
}
has() {  # has PAGE SENTENCE: the page's text contains the sentence
  [[ -f $html/$1 ]] && grep -qF -- "$(tr -s ' ' <<<"$2")" <(text "$html/$1" | sed 's/ \([.,;:)]\)/\1/g; s/( /(/g')
}
count() { text "$html/$1" | grep -oF -- "$2" | wc -l; }

version=$(sed -n 's/^#define IBEV_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$version_h" |
  paste -sd.)
expect "the reference is of ibev $version" has index.html "ibev $version"

dispatcher=classibev_1_1Dispatcher.html
expect "Dispatcher's page has its member comments" \
  has $dispatcher "Builds the epoll loop and the registry; starts no dispatching thread."
expect "Dispatcher's page has its header's opening comment" \
  has $dispatcher "ibev::Dispatcher: one epoll loop that serves every device's async events"
expect "Dispatcher's page says how to include it" has $dispatcher "#include <ibev/dispatch/dispatcher.h>"
expect "dispatcher.h's page has its opening comment" \
  has dispatcher_8h.html "Completions follow ibv_get_cq_event(3): watch_completions() arms the CQ"
# The opening comment of event_type.h is the file's, not its first enum's.
expect "event_type.h's opening comment is its file's description" \
  has event__type_8h.html "The classification of every rdma-core async event type."
expect "... and not ElementKind's" \
  test "$(count namespaceibev.html "The classification of every rdma-core async event type")" -eq 0
expect "ElementKind has its own comment" has namespaceibev.html "What an async event's element names."
expect "an enumerator's trailing comment documents it (DeviceLoss::kRemoved)" \
  has namespaceibev.html "kRemoved the kernel removed it: its uverbs node went away (a rdma link delete"
expect "a field's trailing comment documents it (Failure::verb)" \
  has structibev_1_1Failure.html "the failing call, or what ran (\"CQ handler\")"
expect "the stats list's comment documents DispatcherStats" \
  has structibev_1_1DispatcherStats.html "turns: turns completed; async_events: read from rdma-core"
expect "DispatcherStats has its counters (IBEV_DECLARE_STATS expanded)" \
  has structibev_1_1DispatcherStats.html "std::uint64_t empty_channel_reads = 0"
expect "every Registry::attach overload has the comment (8)" \
  test "$(count classibev_1_1Registry.html "An object's handler, as the event_handler of ib_create_cq/qp/srq/wq.")" -ge 8
expect "a comment inside a function body stays out (AsioDriver)" \
  test "$(count classibev_1_1AsioDriver.html "A dup: the descriptor object closes")" -eq 0
expect "an example is code (event_wait.h)" \
  grep -q '<div class="fragment">.*drained' "$html/event__wait_8h.html"
expect "<ibev/ibev.h> in a comment is text" \
  has ibev_8h.html "<ibev/ibev.h>: all of ibev's public API in one include."
file_pages=("$html"/*_8h.html)
expect "every public header has its page" test "${#file_pages[@]}" -eq "${#headers[@]}"

rm -rf "$out"
echo "doxygen_test: $passed passed, $failed failed"
((failed == 0))

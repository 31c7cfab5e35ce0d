// Boost.Beast as ibev-watch compiles it: include this before any Boost
// header in a file that parses HTTP requests, so that every such file (and
// the fuzz target, tests/fuzz/http_request_fuzz.cc) sees the same parser.
//
// Beast 1.74's request parser asserts `n >= 5` in parse_chunk_header when the
// CRLF after a final chunk's "0\r\n" comes in a later read than it: legal
// HTTP, which the code after the assertion handles by asking for more
// (upstream fixed the assertion in 2024, boostorg/beast#2861). In a build
// with assertions, Bazel's default, any client could abort ibev-watch with
// it; the fuzz target found it. Boost's assertions are off here, as they
// are in the release build (NDEBUG).
#ifndef IBEV_APPS_IBEV_WATCH_BEAST_H_
#define IBEV_APPS_IBEV_WATCH_BEAST_H_

#ifndef BOOST_DISABLE_ASSERTS
#define BOOST_DISABLE_ASSERTS
#endif

#endif  // IBEV_APPS_IBEV_WATCH_BEAST_H_

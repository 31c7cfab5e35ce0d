// thread_safety_fixture.cc with its guarded field read unlocked: what
// tools/thread_safety.sh must reject.
#define UNLOCKED_READ
#include "tests/tools/thread_safety_fixture.cc"

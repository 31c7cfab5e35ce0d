// The version of ibev, in the one place it is written. The CMake build, the
// pkg-config file, the CMake package's version file and the Debian packages
// all read it from here (CMakeLists.txt parses the three defines below).
//
// The major version is the SONAME's (libibev.so.0): it changes when the ABI
// does. While it is 0, a minor version may change the API too.
#ifndef IBEV_VERSION_H_
#define IBEV_VERSION_H_

#define IBEV_VERSION_MAJOR 0
#define IBEV_VERSION_MINOR 9
#define IBEV_VERSION_PATCH 0

#define IBEV_VERSION_STRINGIFY_(x) #x
#define IBEV_VERSION_STRING_(major, minor, patch) \
  IBEV_VERSION_STRINGIFY_(major) "." IBEV_VERSION_STRINGIFY_(minor) "." IBEV_VERSION_STRINGIFY_(patch)
// "0.2.0"
#define IBEV_VERSION_STRING \
  IBEV_VERSION_STRING_(IBEV_VERSION_MAJOR, IBEV_VERSION_MINOR, IBEV_VERSION_PATCH)

#endif  // IBEV_VERSION_H_

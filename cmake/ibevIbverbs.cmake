# ibev::ibverbs: rdma-core's libibverbs (libibverbs-dev), which ships no CMake
# package. Included by ibev's own build and by the installed ibevConfig.cmake,
# so that ibev and its consumers find the same library the same way.
if(NOT TARGET ibev::ibverbs)
  find_path(IBEV_IBVERBS_INCLUDE_DIR infiniband/verbs.h)
  find_library(IBEV_IBVERBS_LIBRARY ibverbs)
  if(NOT IBEV_IBVERBS_INCLUDE_DIR OR NOT IBEV_IBVERBS_LIBRARY)
    message(FATAL_ERROR
      "ibev needs rdma-core's libibverbs: infiniband/verbs.h and libibverbs "
      "were not found (Debian: apt-get install libibverbs-dev)")
  endif()
  add_library(ibev::ibverbs INTERFACE IMPORTED)
  set_target_properties(ibev::ibverbs PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${IBEV_IBVERBS_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "${IBEV_IBVERBS_LIBRARY}")
endif()

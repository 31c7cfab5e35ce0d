# ibev::ibverbs and ibev::rdmacm: rdma-core's libibverbs (libibverbs-dev) and
# librdmacm (librdmacm-dev), which ship no CMake package. Included by ibev's
# own build and by the installed ibevConfig.cmake, so that ibev and its
# consumers find the same libraries the same way.
foreach(_ibev_rdma ibverbs rdmacm)
  if(_ibev_rdma STREQUAL "ibverbs")
    set(_ibev_header infiniband/verbs.h)
  else()
    set(_ibev_header rdma/rdma_cma.h)
  endif()
  string(TOUPPER "${_ibev_rdma}" _ibev_upper)
  if(NOT TARGET ibev::${_ibev_rdma})
    find_path(IBEV_${_ibev_upper}_INCLUDE_DIR ${_ibev_header})
    find_library(IBEV_${_ibev_upper}_LIBRARY ${_ibev_rdma})
    if(NOT IBEV_${_ibev_upper}_INCLUDE_DIR OR NOT IBEV_${_ibev_upper}_LIBRARY)
      message(FATAL_ERROR
        "ibev needs rdma-core's lib${_ibev_rdma}: ${_ibev_header} and lib${_ibev_rdma} "
        "were not found (Debian: apt-get install lib${_ibev_rdma}-dev)")
    endif()
    add_library(ibev::${_ibev_rdma} INTERFACE IMPORTED)
    set_target_properties(ibev::${_ibev_rdma} PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${IBEV_${_ibev_upper}_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${IBEV_${_ibev_upper}_LIBRARY}")
  endif()
endforeach()

# Finds xxHash (Debian: libxxhash-dev) and defines the imported target xxHash::xxhash.
find_path(xxHash_INCLUDE_DIR NAMES xxhash.h)
find_library(xxHash_LIBRARY NAMES xxhash)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(xxHash
  REQUIRED_VARS xxHash_LIBRARY xxHash_INCLUDE_DIR
  REASON_FAILURE_MESSAGE "install the Debian package libxxhash-dev (bash scripts/install-deps.sh)")
if(xxHash_FOUND AND NOT TARGET xxHash::xxhash)
  add_library(xxHash::xxhash UNKNOWN IMPORTED)
  set_target_properties(xxHash::xxhash PROPERTIES
    IMPORTED_LOCATION ${xxHash_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${xxHash_INCLUDE_DIR})
endif()

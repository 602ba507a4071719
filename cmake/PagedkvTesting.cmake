# Registers every Catch2 test case of `target` with CTest, honestly:
#   - `-w NoTests`: an entry whose name matches no test case fails instead of passing
#     (CTest splits names at ';', so such a case would otherwise never run and pass);
#   - a case that cannot run here (no CUDA device, no trace file) prints the marker of
#     tests/support/skip.h and is reported skipped, never passed.
# Extra arguments go to catch_discover_tests (TEST_PREFIX, more PROPERTIES).
include(Catch)

# Catch2's main, compiled once for every test binary (it takes most of a minute).
if(NOT TARGET pagedkv_test_main)
  add_library(pagedkv_test_main STATIC ${PROJECT_SOURCE_DIR}/tests/test_main.cc)
  target_link_libraries(pagedkv_test_main PUBLIC Catch2::Catch2)
  pagedkv_target_options(pagedkv_test_main)
endif()
function(pagedkv_discover_tests target)
  cmake_parse_arguments(ARG "" "TEST_PREFIX" "PROPERTIES" ${ARGN})
  catch_discover_tests(${target}
    TEST_PREFIX "${ARG_TEST_PREFIX}"
    EXTRA_ARGS -w NoTests
    PROPERTIES SKIP_REGULAR_EXPRESSION "PAGEDKV_SKIPPED:" ${ARG_PROPERTIES})
endfunction()

# Registers every Catch2 test case of `target` with CTest, honestly:
#   - `-w NoTests`: an entry whose name matches no test case fails instead of passing
#     (CTest splits names at ';', so such a case would otherwise never run and pass);
#   - a case that cannot run here (no CUDA device, no trace file) prints the marker of
#     tests/support/skip.h and is reported skipped, never passed.
# Extra arguments go to catch_discover_tests (TEST_PREFIX, more PROPERTIES).
include(Catch)
function(pagedkv_discover_tests target)
  cmake_parse_arguments(ARG "" "TEST_PREFIX" "PROPERTIES" ${ARGN})
  catch_discover_tests(${target}
    TEST_PREFIX "${ARG_TEST_PREFIX}"
    EXTRA_ARGS -w NoTests
    PROPERTIES SKIP_REGULAR_EXPRESSION "PAGEDKV_SKIPPED:" ${ARG_PROPERTIES})
endfunction()

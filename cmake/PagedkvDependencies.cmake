# Finds the Debian-packaged dependencies; a missing one fails with the package to install.
macro(pagedkv_require package debian_package)
  find_package(${package} ${ARGN} QUIET)
  if(NOT ${package}_FOUND)
    message(FATAL_ERROR
      "pagedkv needs ${package}: install the Debian package ${debian_package} "
      "(bash scripts/install-deps.sh installs every dependency)")
  endif()
endmacro()

pagedkv_require(absl libabsl-dev CONFIG)
pagedkv_require(xxHash libxxhash-dev)
pagedkv_require(fmt libfmt-dev CONFIG)
if(PAGEDKV_BUILD_EXAMPLES OR PAGEDKV_BUILD_BENCH)  # JSON of traces, reports and summaries
  pagedkv_require(nlohmann_json nlohmann-json3-dev 3 CONFIG)
else()  # the planner library (src/planner) is built when it is there
  find_package(nlohmann_json 3 CONFIG QUIET)
endif()
if(PAGEDKV_BUILD_TESTS)
  pagedkv_require(Catch2 catch2 2 CONFIG)
endif()
if(PAGEDKV_BUILD_BENCH)
  pagedkv_require(benchmark libbenchmark-dev CONFIG)
endif()

# Warning, sanitizer and check-level flags applied to every target of ours.
set(PAGEDKV_CXX_WARNINGS -Wall -Wextra -Werror)
set(PAGEDKV_SANITIZER_FLAGS -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer)

function(pagedkv_target_options target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:${PAGEDKV_CXX_WARNINGS}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings -Xcompiler=-Wall,-Wextra>)
  if(PAGEDKV_SANITIZE)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${PAGEDKV_SANITIZER_FLAGS}>)
    target_link_options(${target} PRIVATE ${PAGEDKV_SANITIZER_FLAGS})
  endif()
  if(PAGEDKV_EXPENSIVE_CHECKS)
    target_compile_definitions(${target} PRIVATE PAGEDKV_EXPENSIVE_CHECKS=1)
  endif()
endfunction()

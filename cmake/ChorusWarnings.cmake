# SPDX-License-Identifier: Apache-2.0
# Warning flags for Chorus's own targets (not for third-party code).
add_library(chorus_warnings INTERFACE)
target_compile_options(chorus_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wnon-virtual-dtor -Wno-missing-field-initializers>
  # -Wshadow=local is gcc's; clang (the fuzz build) has no such option.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wshadow=local>
  $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>)
if(CHORUS_WERROR)
  target_compile_options(chorus_warnings INTERFACE -Werror)
endif()

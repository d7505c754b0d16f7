# SPDX-License-Identifier: Apache-2.0
# CHORUS_SANITIZE="address;undefined" or "thread": instruments everything built here.
if(CHORUS_SANITIZE)
  list(JOIN CHORUS_SANITIZE "," _chorus_san)
  message(STATUS "chorus: sanitizers ${_chorus_san}")
  add_compile_options(-fsanitize=${_chorus_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_chorus_san})
endif()

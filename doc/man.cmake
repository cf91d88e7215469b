# doc/man.cmake: make a man page with a program's hidden --dump-man (issue 18); run by the build:
#   cmake -DPROG=... -DTEMPLATE=doc/X.in -DOUT=.../X -P doc/man.cmake
# Also runs PROG --check-docs and shows what it finds as a warning; the test doc.man fails on it.
set(ENV{ASAN_OPTIONS} "detect_leaks=0")
execute_process(COMMAND ${PROG} --dump-man ${TEMPLATE} OUTPUT_FILE ${OUT}.tmp RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUT}.tmp)
  message(FATAL_ERROR "${PROG} --dump-man ${TEMPLATE} failed (${rc})")
endif()
file(RENAME ${OUT}.tmp ${OUT})
execute_process(COMMAND ${PROG} --check-docs RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(WARNING "undocumented in ${OUT} (fix the help text):\n${err}")
endif()

# libFuzzer targets: project sources compiled again with clang's
# -fsanitize=fuzzer,address,undefined (gcc has no libFuzzer), one binary
# per harness.  TS_CLANG is empty, and every target skipped, without a
# clang that can link libFuzzer (its runtime is libclang-rt-*-dev).
find_program(TS_CLANG NAMES clang-14 clang)
# Seconds each fuzz test runs in the suite (libFuzzer's -max_total_time):
# a smoke run from the seeds and the regression corpora; longer runs:
# bench/fuzz.sh --seconds N.
set(TS_FUZZ_SECONDS 10 CACHE STRING "seconds each fuzz test of the suite runs")
if(TS_CLANG)
  set(probe ${CMAKE_CURRENT_BINARY_DIR}/fuzz_probe.c)
  file(WRITE ${probe} "#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n")
  execute_process(COMMAND ${TS_CLANG} -fsanitize=fuzzer,address,undefined ${probe} -o ${probe}.bin
                  RESULT_VARIABLE probe_rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT probe_rc EQUAL 0)
    message(STATUS "${TS_CLANG} cannot build libFuzzer targets: the fuzz tests are skipped")
    unset(TS_CLANG CACHE)
    set(TS_CLANG "")
  endif()
else()
  message(STATUS "clang not found: the fuzz tests are skipped")
endif()

# ts_fuzz_target(NAME HARNESS [MDL] SOURCES file... [DEPENDS file...]
#                COMMENT text): builds
# ${CMAKE_CURRENT_BINARY_DIR}/NAME from HARNESS and SOURCES (a target NAME
# in ALL) and sets NAME_BIN in the caller.  MDL adds the generated lexer
# and parser (the frontend); DEPENDS names headers the harness includes.  The harness sees TS_SOURCE_DIR, the source
# root, as a string.
function(ts_fuzz_target name harness)
  cmake_parse_arguments(F "MDL" "COMMENT" "SOURCES;DEPENDS" ${ARGN})
  set(bin ${CMAKE_CURRENT_BINARY_DIR}/${name})
  set(generated "")
  set(generated_deps "")
  if(F_MDL)
    set(generated ${PROJECT_BINARY_DIR}/mdl_lexer.c ${PROJECT_BINARY_DIR}/mdl_parser.c)
    set(generated_deps ${FLEX_mdl_lexer_OUTPUTS} ${BISON_mdl_parser_OUTPUTS})
  endif()
  add_custom_command(
    OUTPUT ${bin}
    COMMAND ${TS_CLANG} -g -O1 -std=gnu11 -D_GNU_SOURCE -w
            -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
            -DTS_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
            -I${PROJECT_SOURCE_DIR} -I${PROJECT_BINARY_DIR}
            ${F_SOURCES} ${generated} ${harness} -o ${bin} -lm -ldl -lpthread
    DEPENDS ${F_SOURCES} ${harness} ${F_DEPENDS} ${generated_deps}
    COMMENT "Building ${F_COMMENT} with ${TS_CLANG}"
    VERBATIM)
  add_custom_target(${name} ALL DEPENDS ${bin})
  if(F_MDL)
    add_dependencies(${name} ts_frontend)   # the generated lexer/parser come from there
  endif()
  set(${name}_BIN ${bin} PARENT_SCOPE)
endfunction()

# The tiny gpt and llama of the 16-bit tests (tests/bf16, tests/fp16).
set(TS_BF16_GPT -D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1
                -D dropout=0.1)
set(TS_BF16_LLAMA -D layers=2 -D d_model=32 -D heads=8 -D kv_heads=4 -D ffn=64 -D seq_len=16 -D vocab=256
                  -D batch=4 -D micro_batch=1)

# ts_16bit_check_cells(AREA PRECISION_ARGS CORE_TAGS ENV ENTRY...): one
# `mcc --check` cell (tests/bf16/check.sh, 10 steps) per ENTRY
# "MODEL:TAG:OPTIONS:LOSS_TOL,PARAMS_TOL" as test AREA.check_MODEL_TAG, the
# options followed by PRECISION_ARGS; labelled parallel, and mpi_matrix
# unless TAG is one of CORE_TAGS (the ASan build runs those).
function(ts_16bit_check_cells area precargs core env)
  foreach(entry ${ARGN})
    ts_layout_cell("${entry}")
    list(GET _ts_cell 3 tol)
    add_test(NAME ${area}.check_${model}_${tag}
             COMMAND bash ${PROJECT_SOURCE_DIR}/tests/bf16/check.sh $<TARGET_FILE:mcc>
                     ${PROJECT_SOURCE_DIR}/samples/${model}.mdl ${TS_BF16_${M}} ${opts} --steps 10 ${precargs})
    set(labels "parallel;mpi_matrix")
    if(tag IN_LIST core)
      set(labels "parallel")
    endif()
    set_tests_properties(${area}.check_${model}_${tag} PROPERTIES TIMEOUT 300 RESOURCE_LOCK mpi_ranks
                         ENVIRONMENT "${env};TS_CHECK_TOL=${tol}" LABELS "${labels}")
  endforeach()
endfunction()

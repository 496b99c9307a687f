# tests/parallel/pipeline.cmake - issue 5's acceptance matrix (included by
# CMakeLists.txt, which defines ts_parallel_test, TS_PAR_CHECK and the
# environment): samples/gpt.mdl and samples/llama.mdl at tiny size with
# pipeline parallelism, pp in {2, 4}, each with 1f1b and interleaved
# (vpp 2), alone and combined with tp 2 and dp 2 (up to 16 ranks), trained
# 10 steps in f64 with `mcc --check` against the single-rank run: per-step
# losses and final parameters within 1e-10.  Then 64 ranks (tp 2 x pp 4 x
# dp 8), a gpipe schedule, zb-h1 (pp 2 and 4, with tp and dp), a Megatron layout with uneven stages, a check
# that must fail, and the compile-time refusals of bad schedule / micro
# batch combinations.
#
# 8 layers (pp 4 x vpp 2 = 8 chunks) and 8 sequences per step in micro
# batches of 1: with dp 2 each dp rank runs 4, enough for 1f1b at pp 4 and
# a multiple of pp for interleaving.  gpt with dropout (masks from global
# indices must agree across stages) and tied embedding / head (a gradient
# summed over the first and last pipeline ranks); llama untied, with
# grouped-query attention.  Cells run 1-3 s (2-8 ranks) and 4-6 s (16
# ranks) in a Release build, the 64-rank one about 18 s (labelled slow);
# all but one cell per model are mpi_matrix (not in the sanitizer run).
set(TS_PIPE_GPT -D layers=8 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=8 -D micro_batch=1
                -D dropout=0.1)
set(TS_PIPE_LLAMA -D layers=8 -D d_model=32 -D heads=8 -D kv_heads=4 -D ffn=64 -D seq_len=16 -D vocab=256
                  -D batch=8 -D micro_batch=1)
# tag : pipeline options (1f1b is the default with vpp 1, interleaved with vpp 2)
set(TS_PIPE_LAYOUTS "pp2:--pp 2" "pp2_vpp2:--pp 2 --vpp 2" "pp4:--pp 4" "pp4_vpp2:--pp 4 --vpp 2")
# tag : the other axes (gpt with sequence parallelism)
set(TS_PIPE_WITH_gpt "alone:" "tp2_dp2_sp:--tp 2 --dp 2 --sp")
set(TS_PIPE_WITH_llama "alone:" "tp2_dp2:--tp 2 --dp 2")

function(ts_pipe_test name)
  ts_parallel_test(${name} ${ARGN})
  get_test_property(parallel.${name} LABELS labels)
  list(APPEND labels pipe)
  # kept in the sanitizer run: one 2-rank cell per model, the refusals and
  # the failing check; the rest is mpi_matrix
  if(name MATCHES "^(gpt[.]pp2[.]f64|llama[.]pp2_vpp2[.]f64|t5[.]pp2[.]f64|gpt[.]pp2_zbh1[.]f64|gpt[.]pp2[.]dp2_at_dp1[.]f64|refuse[.].*|pipe_check_detects_difference)$")
    list(REMOVE_ITEM labels mpi_matrix)
  elseif(NOT "mpi_matrix" IN_LIST labels)
    list(APPEND labels mpi_matrix)
  endif()
  if(name MATCHES "gpus64")
    list(APPEND labels slow)
  endif()
  set_tests_properties(parallel.${name} PROPERTIES LABELS "${labels}")
endfunction()

foreach(model gpt llama)
  string(TOUPPER ${model} M)
  foreach(entry ${TS_PIPE_LAYOUTS})
    string(REPLACE ":" ";" parts "${entry}")
    list(GET parts 0 tag)
    list(GET parts 1 popts)
    foreach(with ${TS_PIPE_WITH_${model}})
      string(REPLACE ":" ";" wparts "${with}")
      list(GET wparts 0 wtag)
      list(LENGTH wparts wn)
      set(wopts "")
      if(wn GREATER 1)
        list(GET wparts 1 wopts)
      endif()
      set(name ${model}.${tag})
      if(NOT wtag STREQUAL "alone")
        set(name ${name}_${wtag})
      endif()
      separate_arguments(opts UNIX_COMMAND "${popts} ${wopts}")
      ts_pipe_test(${name}.f64 ${TS_PAR_CHECK} ${PROJECT_SOURCE_DIR}/samples/${model}.mdl 1e-10
                   ${TS_PIPE_${M}} ${opts} --steps 10)
    endforeach()
  endforeach()
endforeach()

# GPipe, and a Megatron layout with uneven stages (E + 3 layers | 2 | 2 | 1 + L)
ts_pipe_test(gpt.pp2_gpipe.f64 ${TS_PAR_CHECK} ${PROJECT_SOURCE_DIR}/samples/gpt.mdl 1e-10
             ${TS_PIPE_GPT} --pp 2 --schedule gpipe --steps 10)
ts_pipe_test(llama.pp4_layout.f64 ${TS_PAR_CHECK} ${PROJECT_SOURCE_DIR}/samples/llama.mdl 1e-10
             ${TS_PIPE_LLAMA} --pp 4 --pp-layout "Et*3|t*2|t*2|tL" --steps 10)

# zb-h1 (issue 19, zero-bubble: backward split into B and W, W deferred):
# pp 2 and 4 (vpp 1), alone and with tp 2 x dp 2, both models
foreach(cell "gpt.pp2_zbh1:--pp 2" "gpt.pp4_zbh1:--pp 4" "gpt.pp2_zbh1_tp2_dp2_sp:--pp 2 --tp 2 --dp 2 --sp"
             "gpt.pp4_zbh1_dp2:--pp 4 --dp 2" "llama.pp2_zbh1:--pp 2" "llama.pp4_zbh1:--pp 4"
             "llama.pp2_zbh1_tp2_dp2:--pp 2 --tp 2 --dp 2")
  string(REPLACE ":" ";" parts "${cell}")
  list(GET parts 0 name)
  list(GET parts 1 popts)
  string(REGEX MATCH "^[a-z]+" model "${name}")
  string(TOUPPER ${model} M)
  separate_arguments(opts UNIX_COMMAND "${popts}")
  ts_pipe_test(${name}.f64 ${TS_PAR_CHECK} ${PROJECT_SOURCE_DIR}/samples/${model}.mdl 1e-10 ${TS_PIPE_${M}} ${opts}
               --schedule zb-h1 --steps 10)
endforeach()

# 64 ranks: tp 2 x pp 4 x dp 8 (32 sequences, 4 micro batches per dp rank), 3 steps
ts_pipe_test(gpt.gpus64_tp2_pp4_dp8.f64 ${TS_PAR_CHECK} ${PROJECT_SOURCE_DIR}/samples/gpt.mdl 1e-10
             -D layers=4 -D d_model=16 -D heads=4 -D seq_len=8 -D vocab=256 -D batch=32 -D micro_batch=1
             --tp 2 --pp 4 --dp 8 --steps 3)
set_tests_properties(parallel.gpt.gpus64_tp2_pp4_dp8.f64 PROPERTIES TIMEOUT 300)
# 64 pipeline ranks (the 1T row of Narayanan et al. 2021 has pp 64): the tied
# embedding's gradient summed by group_sum over coordinates 0 and 63, whose
# 64-bit mask is negative as an int64 (ranks=-9223372036854775807), 2 steps
ts_pipe_test(gpt.gpus64_pp64.f64 ${TS_PAR_CHECK} ${PROJECT_SOURCE_DIR}/samples/gpt.mdl 1e-10
             -D layers=64 -D d_model=16 -D heads=2 -D seq_len=8 -D vocab=256 -D batch=64 -D micro_batch=1
             --pp 64 --steps 2)
set_tests_properties(parallel.gpt.gpus64_pp64.f64 PROPERTIES TIMEOUT 300)

# Several layer stacks (issue 24, deliverable 6): samples/t5.mdl, an
# encoder-decoder with equal depths (2 + 2 layers; source = the first 8
# positions, target = the last 8), cut over both stacks in order: pp 2 (the
# cut between the stacks), pp 4 (cuts inside each stack: the encoder
# output travels with the decoder's hidden state), pp 2 x vpp 2, pp 2 x tp
# 2, zb-h1, --pp-stack, an uneven 1 + 3 split; tp 2 and dp 2 alone.  5
# steps, f64 <= 1e-10.
set(TS_PIPE_T5 -D enc_layers=2 -D dec_layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=8
               -D micro_batch=1)
foreach(cell "t5.pp2:--pp 2" "t5.pp4:--pp 4" "t5.pp2_vpp2:--pp 2 --vpp 2" "t5.pp2_tp2:--pp 2 --tp 2"
             "t5.pp4_zbh1:--pp 4 --schedule zb-h1" "t5.pp2_stack_dec:--pp 2 --pp-stack dec_layers"
             "t5.pp2_enc1_dec3:--pp 2 -D enc_layers=1 -D dec_layers=3" "t5.tp2:--tp 2" "t5.dp2:--dp 2")
  string(REPLACE ":" ";" parts "${cell}")
  list(GET parts 0 name)
  list(GET parts 1 popts)
  separate_arguments(opts UNIX_COMMAND "${popts}")
  ts_pipe_test(${name}.f64 ${TS_PAR_CHECK} ${PROJECT_SOURCE_DIR}/samples/t5.mdl 1e-10 ${TS_PIPE_T5} ${opts}
               --steps 5)
endforeach()

# a weight of the first stack read by the head after the second (shared
# across pipeline ranks, like a tied embedding)
foreach(cell "tied_stacks.pp2:--pp 2" "tied_stacks.pp4:--pp 4")
  string(REPLACE ":" ";" parts "${cell}")
  list(GET parts 0 name)
  list(GET parts 1 popts)
  separate_arguments(opts UNIX_COMMAND "${popts}")
  ts_pipe_test(${name}.f64 ${TS_PAR_CHECK} ${PROJECT_SOURCE_DIR}/tests/pipe/tied_stacks.mdl 1e-10 ${opts} --steps 5)
endforeach()

# The check can fail with pipeline parallelism too (the layout's run with another seed)
ts_pipe_test(pipe_check_detects_difference bash ${CMAKE_CURRENT_SOURCE_DIR}/expect_fail.sh $<TARGET_FILE:mcc>
             ${PROJECT_SOURCE_DIR}/samples/gpt.mdl ${TS_PIPE_GPT} --pp 2 --steps 2)

# Compile-time refusals of a pipeline plan, naming the numbers
ts_pipe_test(refuse.pipe_nmicro ${TS_PAR_REFUSE} ${CMAKE_CURRENT_BINARY_DIR}/tmp_pipe_nmicro
             "--schedule 1f1b with pp=4 needs at least 4 micro batches per step, and there are 2"
             ${PROJECT_SOURCE_DIR}/samples/gpt.mdl ${TS_PIPE_GPT} --pp 4 --dp 4)
ts_pipe_test(refuse.pipe_interleaved ${TS_PAR_REFUSE} ${CMAKE_CURRENT_BINARY_DIR}/tmp_pipe_il
             "to be a multiple of pp=4" ${PROJECT_SOURCE_DIR}/samples/gpt.mdl ${TS_PIPE_GPT} -D batch=6 --pp 4 --vpp 2)
ts_pipe_test(refuse.pipe_stages ${TS_PAR_REFUSE} ${CMAKE_CURRENT_BINARY_DIR}/tmp_pipe_stages
             "16 stages but the stack 'layers' has only 8 layers" ${PROJECT_SOURCE_DIR}/samples/gpt.mdl ${TS_PIPE_GPT}
             --pp 4 --vpp 4)
ts_pipe_test(refuse.pipe_zbh1_nmicro ${TS_PAR_REFUSE} ${CMAKE_CURRENT_BINARY_DIR}/tmp_pipe_zb
             "--schedule zb-h1 with pp=4 needs at least 4 micro batches per step, and there are 2"
             ${PROJECT_SOURCE_DIR}/samples/gpt.mdl ${TS_PIPE_GPT} --pp 4 --dp 4 --schedule zb-h1)
ts_pipe_test(refuse.pipe_zbh1_vpp ${TS_PAR_REFUSE} ${CMAKE_CURRENT_BINARY_DIR}/tmp_pipe_zbv
             "--schedule zb-h1 runs one chunk per rank, and vpp=2" ${PROJECT_SOURCE_DIR}/samples/gpt.mdl
             ${TS_PIPE_GPT} --pp 2 --vpp 2 --schedule zb-h1)

# Pipeline plans at any dp (issue 19): mrun respecializes each pipeline
# rank's program for the run's dp and regenerates its schedule for the
# run's micro batches per dp rank.  Each cell compiles the layout at dp
# FROM and runs it at dp TO, 5 steps in f64: equal to the single-rank run
# and to the plan compiled at dp TO, both within 1e-10 (atdp.sh).  With
# ZeRO-1 (the default) and without, 1f1b, interleaved (vpp 2) and zb-h1.
set(TS_PAR_ATDP bash ${CMAKE_CURRENT_SOURCE_DIR}/atdp.sh $<TARGET_FILE:mcc> $<TARGET_FILE:mrun>
                $<TARGET_FILE:params_diff>)
# name : gpus : from : to : layout
foreach(cell "gpt.pp2:4:1:2:--pp 2" "gpt.pp2:2:2:1:--pp 2" "gpt.pp2_vpp2:4:1:2:--pp 2 --vpp 2"
             "gpt.pp2_zbh1:4:1:2:--pp 2 --schedule zb-h1" "llama.pp2_nozero:4:1:2:--pp 2 --no-zero"
             # ZeRO-1 over dp x cp made at mrun time (moments flat over dp+cp), and undone at dp 1
             "llama.cp2:4:1:2:--cp 2" "llama.cp2:2:2:1:--cp 2")
  string(REPLACE ":" ";" parts "${cell}")
  list(GET parts 0 name)
  list(GET parts 1 gpus)
  list(GET parts 2 from)
  list(GET parts 3 to)
  list(GET parts 4 popts)
  string(REGEX MATCH "^[a-z]+" model "${name}")
  string(TOUPPER ${model} M)
  separate_arguments(opts UNIX_COMMAND "${popts}")
  ts_pipe_test(${name}.dp${from}_at_dp${to}.f64 ${TS_PAR_ATDP} ${CMAKE_CURRENT_BINARY_DIR}/atdp_${name}_${from}_${to}
               ${PROJECT_SOURCE_DIR}/samples/${model}.mdl 1e-10 5 ${gpus} ${from} ${to} ${TS_PIPE_${M}} -- ${opts})
endforeach()
# a cp run posts no dp bucket on CPU ranks (main's runs neither): only the counts are compared
set_property(TEST parallel.llama.cp2.dp1_at_dp2.f64 APPEND PROPERTY ENVIRONMENT "TS_ATDP_BUCKETS=0")
# One-moment optimizers (sgd, lion: each kind's moments made again, in a
# direct compile's order), the optimizer in every compile (single rank too).
# Lion on llama: on gpt the attention key bias's gradient is 0 in exact
# arithmetic and Lion's sign() makes rounding noise a full step (docs/cli.md).
foreach(cell "gpt:sgd" "llama:lion")
  string(REPLACE ":" ";" parts "${cell}")
  list(GET parts 0 model)
  list(GET parts 1 opt)
  string(TOUPPER ${model} M)
  ts_pipe_test(${model}.pp2_${opt}.dp1_at_dp2.f64 ${TS_PAR_ATDP} ${CMAKE_CURRENT_BINARY_DIR}/atdp_${model}_${opt}
               ${PROJECT_SOURCE_DIR}/samples/${model}.mdl 1e-10 5 4 1 2 ${TS_PIPE_${M}} --optimizer ${opt} -- --pp 2)
endforeach()
# ... and refused, before any rank starts, where the schedule cannot run the
# micro batches a dp rank gets, naming the numbers and the --gpus that work:
# 1f1b at pp 4 on 16 ranks (dp 4: 8 / 4 = 2 micro batches < pp), interleaved
# at pp 2 x vpp 2 with 6 sequences on 4 ranks (dp 2: 3, not a multiple of pp)
set(TS_PAR_MRUN_REFUSE bash ${CMAKE_CURRENT_SOURCE_DIR}/mrun_refuse.sh $<TARGET_FILE:mcc> $<TARGET_FILE:mrun>)
ts_pipe_test(refuse.atdp_1f1b ${TS_PAR_MRUN_REFUSE} ${CMAKE_CURRENT_BINARY_DIR}/tmp_atdp_1f1b 16
             "needs at least 4 micro batches per step, and there are 2: raise global_batch or lower micro_batch (or use gpipe). The --gpus values that work: 4, 8"
             ${PROJECT_SOURCE_DIR}/samples/gpt.mdl ${TS_PIPE_GPT} --pp 4)
ts_pipe_test(refuse.atdp_interleaved ${TS_PAR_MRUN_REFUSE} ${CMAKE_CURRENT_BINARY_DIR}/tmp_atdp_il 4
             "needs the micro batches per step (3) to be a multiple of pp=2. The --gpus values that work: 2, 6"
             ${PROJECT_SOURCE_DIR}/samples/gpt.mdl ${TS_PIPE_GPT} -D batch=6 --pp 2 --vpp 2)

/* toy_hw.h - a made-up machine with round figures, so that the expected
 * times of tests/simtime's C tests can be worked out by hand (test_simtime.c
 * also edits it line by line: keep its lines in this order). */
#ifndef TS_TESTS_TOY_HW_H
#define TS_TESTS_TOY_HW_H
static const char *toy =
    "# toy machine for hand computation\n"
    "name toy\n"
    "peak fp32 100e12\n"
    "gemm_efficiency fp32 0.5\n"
    "attention_efficiency fp32 0.25\n"
    "hbm_bytes 1e9\n"
    "hbm_bandwidth 20e12\n"
    "memory_efficiency 0.5\n"
    "sms 4\n"
    "gemm_tile_m 128\n"
    "gemm_tile_n 128\n"
    "gemm_tile_k 256\n"
    "kernel_overhead 0\n"
    "gpus_per_node 8\n"
    "nvlink_bandwidth 400e9\n"
    "nvlink_latency 1e-6\n"
    "nvlink_efficiency 0.5\n"
    "nics_per_node 4\n"
    "nic_bandwidth 50e9\n"
    "nic_latency 10e-6\n"
    "nic_efficiency 1\n";
#endif

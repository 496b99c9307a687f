/* indexed.c - Megatron's indexed dataset, PREFIX.bin + PREFIX.idx
 * (indexed.h; docs/data.md "Indexed datasets"). */
#include "indexed.h"

size_t rt_idx_dtype_size(int code) {
  switch (code) {
  case RT_IDX_U8: case RT_IDX_I8: return 1;
  case RT_IDX_I16: case RT_IDX_U16: return 2;
  case RT_IDX_I32: case RT_IDX_F32: return 4;
  case RT_IDX_I64: case RT_IDX_F64: return 8;
  default: return 0;
  }
}

/* Megatron's choice (megatron/core/datasets/indexed_dataset.py): u16 below
 * 65500 ids, else i32 */
int rt_idx_dtype_for_vocab(int64_t n) { return n < 65500 ? RT_IDX_U16 : RT_IDX_I32; }

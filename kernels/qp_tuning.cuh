// qp_tuning.cuh: the tuning values every kernel reads (block sizes, vectors per thread, resident
// blocks per SM). They are defines from one Python table, quantplan/runtime/_tuning.py (Tuning), which the
// launch geometry reads too; the compile layer passes them (-DQP_<NAME>=<value>). No default here:
// a compile without them stops.
// The #ifndef lines below are guards, not tuning macros: none holds a value, so the Python table
// is the only source of every value (a standalone compile passes the table's defines too). The
// guard list names exactly the table's fields (tests/test_tuning.py checks it).
#pragma once

#ifndef QP_ROW_UNROLL
#error "QP_ROW_UNROLL is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_QUANTIZE_MIN_BLOCKS
#error "QP_QUANTIZE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DENSE_ROWS_BLOCK
#error "QP_DENSE_ROWS_BLOCK is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DENSE_ROWS_MIN_BLOCKS
#error "QP_DENSE_ROWS_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DENSE_QUANTIZE_UNROLL
#error "QP_DENSE_QUANTIZE_UNROLL is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DENSE_QUANTIZE_BACKWARD_UNROLL
#error "QP_DENSE_QUANTIZE_BACKWARD_UNROLL is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DENSE_DEQUANTIZE_UNROLL
#error "QP_DENSE_DEQUANTIZE_UNROLL is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DENSE_DEQUANTIZE_BACKWARD_UNROLL
#error "QP_DENSE_DEQUANTIZE_BACKWARD_UNROLL is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DENSE_QBWD_BF16_MIN_BLOCKS
#error "QP_DENSE_QBWD_BF16_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DENSE_BLOCK
#error "QP_DENSE_BLOCK is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DENSE_MIN_BLOCKS
#error "QP_DENSE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_LANES_MIN_BLOCKS
#error "QP_LANES_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_ROWS_BLOCK
#error "QP_ROWS_BLOCK is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_ROWS_MIN_BLOCKS
#error "QP_ROWS_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_SHARES_BLOCK
#error "QP_SHARES_BLOCK is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_CLUSTER_BLOCKS
#error "QP_CLUSTER_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_MIN_BLOCKS
#error "QP_FAKE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_FLAT_UNROLL
#error "QP_FAKE_FLAT_UNROLL is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_DENSE_ROWS_BLOCK
#error "QP_FAKE_DENSE_ROWS_BLOCK is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_DENSE_ROWS_MIN_BLOCKS
#error "QP_FAKE_DENSE_ROWS_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_DENSE_ROWS_WIDE_MIN_BLOCKS
#error "QP_FAKE_DENSE_ROWS_WIDE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_DENSE_STE_MIN_BLOCKS
#error "QP_FAKE_DENSE_STE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_DENSE_THREAD_BYTES
#error "QP_FAKE_DENSE_THREAD_BYTES is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_DENSE_STOCHASTIC_THREAD_BYTES
#error "QP_FAKE_DENSE_STOCHASTIC_THREAD_BYTES is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_DENSE_STE_THREAD_BYTES
#error "QP_FAKE_DENSE_STE_THREAD_BYTES is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_DENSE_MIN_BLOCKS
#error "QP_FAKE_DENSE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_FAKE_ROWS_MIN_BLOCKS
#error "QP_FAKE_ROWS_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_QGZ_SEGMENT_BOUND
#error "QP_QGZ_SEGMENT_BOUND is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_QGZ_DENSE_BLOCK
#error "QP_QGZ_DENSE_BLOCK is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_QGZ_DENSE_QUANTIZE_MIN_BLOCKS
#error "QP_QGZ_DENSE_QUANTIZE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_REDUCE_DENSE_BLOCK
#error "QP_REDUCE_DENSE_BLOCK is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_REDUCE_DENSE_MIN_BLOCKS
#error "QP_REDUCE_DENSE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_REDUCE_DENSE_BATCH_BYTES
#error "QP_REDUCE_DENSE_BATCH_BYTES is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_REDUCE_DENSE_FMA_MIN_EPT
#error "QP_REDUCE_DENSE_FMA_MIN_EPT is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DS_DENSE_BLOCK
#error "QP_DS_DENSE_BLOCK is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DS_DENSE_MIN_BLOCKS
#error "QP_DS_DENSE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DS_REDUCE_MIN_BLOCKS
#error "QP_DS_REDUCE_MIN_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif
#ifndef QP_DS_CLUSTER_BLOCKS
#error "QP_DS_CLUSTER_BLOCKS is not defined: compile with quantplan.runtime._tuning.kernel_options()"
#endif

# The tiny gpt and llama of the 16-bit tests (tests/bf16, tests/fp16).
set(TS_BF16_GPT -D layers=2 -D d_model=32 -D heads=4 -D seq_len=16 -D vocab=256 -D batch=4 -D micro_batch=1
                -D dropout=0.1)
set(TS_BF16_LLAMA -D layers=2 -D d_model=32 -D heads=8 -D kv_heads=4 -D ffn=64 -D seq_len=16 -D vocab=256
                  -D batch=4 -D micro_batch=1)

/* tokenizer.h - byte-level BPE tokenizers, as GPT-2, Llama 3 and most
 * Hugging Face models use them (docs/data.md "Tokenizers").
 *
 * A tokenizer comes from either
 *   - GPT-2's pair of files: vocab.json ({"token": id, ...}) and
 *     merges.txt (one "left right" merge per line, highest priority first,
 *     an optional "#version" first line), with GPT-2's pre-tokenizer regex;
 *   - a Hugging Face tokenizer.json whose model is BPE, with its
 *     pre-tokenizer (ByteLevel, or a Sequence of Split(regex) + ByteLevel as
 *     Llama 3's: the regexes GPT-2's and Llama 3's tokenizers use), its
 *     added / special tokens and its decoder (ByteLevel).
 * Text is UTF-8.  Invalid UTF-8 is read as U+FFFD for each maximal invalid
 * subpart (Python's bytes.decode("utf-8", "replace")), so the ids equal
 * those of the PyPI `tokenizers` package given the text Python decodes.
 * Ids are identical to that package's `encode(text).ids` (no post-processor
 * tokens added).  Thread-safe after loading: encode and decode only read
 * the tokenizer. */
#ifndef TS_RT_TOKENIZER_H
#define TS_RT_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>

typedef struct RtTokenizer RtTokenizer;

/* path: a tokenizer.json, a vocab.json (merges.txt beside it), or a
 * directory holding one of them (tokenizer.json first).  NULL with err
 * naming the file and the problem (file:line or the JSON key). */
RtTokenizer *rt_tok_load(const char *path, char *err, size_t errlen);
/* GPT-2's pair of files given separately. */
RtTokenizer *rt_tok_load_gpt2(const char *vocab_json, const char *merges_txt, char *err, size_t errlen);
void rt_tok_free(RtTokenizer *t);

/* 1 + the largest id (vocabulary and added tokens). */
int64_t rt_tok_vocab_size(const RtTokenizer *t);
/* The id of a token spelled as in the vocabulary or the added tokens
 * ("<|endoftext|>"), -1 if none. */
int32_t rt_tok_id(const RtTokenizer *t, const char *token);
/* The end-of-document id: "<|endoftext|>", "<|end_of_text|>", "</s>" or
 * "<eos>", whichever the tokenizer has (in that order); -1 if none. */
int32_t rt_tok_eod(const RtTokenizer *t);

/* Appends the ids of text[0, len) to *ids (grown with realloc: *n used,
 * *cap allocated).  Added / special tokens in the text are matched as
 * the package matches them.  0, or -1 when memory runs out. */
int rt_tok_encode(const RtTokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap);
/* Appends the text of ids[0, n) to *out (grown with realloc: *len used,
 * *cap allocated; NUL-terminated).  0, or -1 with err naming the first id
 * out of range. */
int rt_tok_decode(const RtTokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len, size_t *cap,
                  char *err, size_t errlen);

#endif

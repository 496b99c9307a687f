/* tok_pretok.h - the text side of the BPE tokenizer (tokenizer.c): UTF-8
 * read as Python reads it, and the two pre-tokenizer regexes that byte-level
 * BPE tokenizers use, each a hand-written scanner that returns the same
 * pieces as the regex under Oniguruma (the PyPI `tokenizers` package's
 * engine: leftmost-first alternation, backtracking). */
#ifndef TS_RT_TOK_PRETOK_H
#define TS_RT_TOK_PRETOK_H
#include <stddef.h>
#include <stdint.h>

/* The regexes, spelled exactly as tokenizer.json stores them. */
#define RT_TOK_RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"
#define RT_TOK_RE_LLAMA3 "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

typedef enum { RT_TOK_RE_NONE, RT_TOK_RE_IS_GPT2, RT_TOK_RE_IS_LLAMA3 } RtTokRe;

/* Which scanner implements pattern (RT_TOK_RE_NONE: none does). */
RtTokRe rt_tok_re_lookup(const char *pattern);

/* The end (a byte offset in s[0, len)) of the regex's match that starts at
 * offset i < len.  s is valid UTF-8.  Every character starts a match of
 * both regexes, so the pieces tile the text. */
size_t rt_tok_re_match(RtTokRe re, const char *s, size_t len, size_t i);

/* Length of the prefix of s[0, len) that is valid UTF-8 (len if all). */
size_t rt_utf8_valid_prefix(const char *s, size_t len);
/* s[0, len) with each maximal invalid subpart replaced by U+FFFD, as
 * Python's bytes.decode("utf-8", "replace"): a malloc'd copy (*outlen
 * bytes), NULL when memory runs out. */
char *rt_utf8_sanitize(const char *s, size_t len, size_t *outlen);
/* The code point at s[*i] (valid UTF-8), advancing *i past it. */
uint32_t rt_utf8_next(const char *s, size_t *i);

#endif

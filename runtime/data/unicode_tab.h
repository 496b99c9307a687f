/* unicode_tab.h - the character classes of the BPE pre-tokenizer regexes
 * (\p{L}, \p{N}, \s) for every Unicode code point, generated into
 * unicode_tab.c by tools/gen_unicode_tab.py (Unicode 14.0.0, the version of
 * the Oniguruma inside the PyPI `tokenizers` package). */
#ifndef TS_RT_UNICODE_TAB_H
#define TS_RT_UNICODE_TAB_H
#include <stdint.h>

enum { RT_UNI_L = 1, RT_UNI_N = 2, RT_UNI_S = 4 };

extern const char rt_uni_version[];
extern const uint8_t rt_uni_block[0x110000 >> 8];
extern const uint8_t rt_uni_class[][256];

/* The class bits of code point cp (0 above U+10FFFF). */
static inline int rt_uni_cls(uint32_t cp) {
  return cp < 0x110000 ? rt_uni_class[rt_uni_block[cp >> 8]][cp & 255] : 0;
}

#endif

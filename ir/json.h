/* json.h - a small, strict JSON reader (RFC 8259) for the files Tessera
 * reads from other programs: a safetensors header, a Hugging Face
 * config.json and model.safetensors.index.json.  The whole text is parsed
 * into a tree allocated from the caller's arena; nothing points into the
 * input.  Strict: no trailing commas, no comments, no duplicate keys, no
 * control characters or NUL in strings, nesting at most TS_JSON_MAX_DEPTH.
 * An error names the line and column. */
#ifndef TS_JSON_H
#define TS_JSON_H
#include "util.h"

#define TS_JSON_MAX_DEPTH 64

typedef enum { TS_JSON_NULL, TS_JSON_BOOL, TS_JSON_NUMBER, TS_JSON_STRING, TS_JSON_ARRAY, TS_JSON_OBJECT } TsJsonKind;

typedef struct TsJson TsJson;
struct TsJson {
  TsJsonKind kind;
  int boolean;              /* TS_JSON_BOOL */
  double num;               /* TS_JSON_NUMBER */
  int is_int;               /* a number written without fraction or exponent that fits int64 */
  int64_t inum;             /* ... its exact value */
  const char *str;          /* TS_JSON_STRING, decoded UTF-8, NUL-terminated */
  int n;                    /* TS_JSON_ARRAY / OBJECT: number of items */
  TsJson **items;           /* the items (an object's values) */
  const char **keys;        /* TS_JSON_OBJECT: the keys, in file order */
};

/* Parses text[0, len) (one value, whitespace around it).  NULL with
 * "what:LINE:COL: error: message" in err on anything malformed. */
TsJson *ts_json_parse(Arena *a, const char *text, size_t len, const char *what, char *err, size_t errlen);
/* The value of key in object o; NULL if o is not an object or lacks it. */
const TsJson *ts_json_get(const TsJson *o, const char *key);
/* "null", "a boolean", "a number", "a string", "an array", "an object". */
const char *ts_json_kind_name(TsJsonKind k);
/* Appends s as a JSON string literal (quotes, escapes) to b. */
void ts_json_put_string(StrBuf *b, const char *s);

#endif

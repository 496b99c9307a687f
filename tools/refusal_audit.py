#!/usr/bin/env python3
"""refusal_audit.py - every error message mcc and mrun can give a user, and
whether a test checks it (issue 24: every refusal has a golden test).

    refusal_audit.py [--root DIR] [--list] [--all] [--file SUBSTR]
                     [--allow FILE] [--write-allow FILE]

It reads the C sources of the stages a user's input reaches (frontend/,
passes/, api/, plan/, runtime/exec/ and tools/{mcc,mrun,mprep,autolayout}.c)
and extracts the format string of every call that reports an error to the
user: ts_errf (the error buffer every stage fills), the frontend's
mdl_error / elab_error / shape_error2 / perr / LEXERR (file:line:col
errors), the stages' own fail helpers (sh_fail, cx_fail, ps_fail, ad_fail,
rd_fail, tx_fail, api_diag), and the tools' direct fprintf(stderr, ...).
The literal parts of a format (the text between its conversion
specifications) are its fragments; the message counts as tested when one
fragment of at least MIN_FRAG characters appears, case-insensitively, in a
file under tests/ that git tracks (a fragment that more than two messages
share counts only for a message with no other; a fragment longer than LONG
characters counts by its first LONG, so a test may leave out a long
message's tail).

Not every such call is a refusal.  A call marked with a comment on its own
lines is left out:
    /* internal */       a consistency check of compiler-made data that no
                         user input reaches (the verifier on the passes' IR,
                         "cannot happen" paths);
    /* not a refusal */  a progress line, a warning or a note that the run
                         goes on after (the tools' fprintf(stderr, ...)).
An fprintf(stderr, ...) whose text says 'warning:' or names a TS_* test hook
(TS_FAULT_KILL: ...) is left out without a mark, and so is a message that
says it is one ("internal error: ...").  A fragment is matched without the
tool's name and "error: " that start it ("mrun: ", "mcc: error: ").
A message with no fragment that long (a bare "%s: %s" passing on another
message) is not counted: the message it passes on is.

The allow-list (--allow, default tests/hostile/refusals_untested.txt) names
messages known to have no test yet: one message's format text per line
(newlines as \\n, ' | ' as ' \\| '), then ' | ' and why it is untested.  The exit status is 1 when a message outside the list
has no test, or when a line of the list names no message any more (so the
list only shrinks); 0 otherwise.
"""
import argparse
import os
import re
import subprocess
import sys

MIN_FRAG = 12
LONG = 80       # a longer fragment counts by its first LONG characters
SOURCES = ['frontend', 'passes', 'api', 'plan', 'runtime/exec']
TOOLS = ['tools/mcc.c', 'tools/mrun.c', 'tools/mprep.c', 'tools/autolayout.c']
# function name -> index of its format argument
REPORTERS = {
    'ts_errf': 2, 'mdl_error': 2, 'elab_error': 2, 'shape_error2': 4, 'perr': 2,
    'LEXERR': 2, 'sh_fail': 1, 'cx_fail': 1, 'ps_fail': 1, 'ad_fail': 1,
    'rd_fail': 1, 'tx_fail': 1, 'api_diag': 1, 'fprintf': 1,
}
MARKS = ('/* internal */', '/* not a refusal */')
# the tool's name and 'error: ' before a message: tests often leave them out
PREFIX = re.compile(r'^(?:(?:mcc|mrun|mprep|tessera|mrun --selftest): )?(?:error: )?')
CALL = re.compile(r'\b(' + '|'.join(REPORTERS) + r')\s*\(')
SPEC = re.compile(r'%[-+ #0-9.*]*(?:hh|h|ll|l|z|j|t|L)?[diouxXeEfFgGaAcspn%]')


def quoted_end(s, i):
    """s[i] opens a C string or character literal: the index after it."""
    j = i + 1
    while j < len(s) and s[j] != s[i]:
        j += 2 if s[j] == '\\' else 1
    return j + 1


def strip_comments(s):
    """Blanks C comments (keeping newlines, so lines and offsets stay those
    of the original), so a '(' or '"' in a comment cannot mislead."""
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        if c == '"' or c == "'":
            j = quoted_end(s, i)
            out.append(s[i:j]); i = j
        elif s.startswith('/*', i):
            j = s.find('*/', i + 2); j = n if j < 0 else j + 2
            out.append(re.sub(r'[^\n]', ' ', s[i:j])); i = j
        elif s.startswith('//', i):
            j = s.find('\n', i); j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j
        else:
            out.append(c); i += 1
    return ''.join(out)


def split_args(s, i):
    """s[i] is just after '('; returns (list of argument texts, end index)."""
    args, depth, start, n = [], 0, i, len(s)
    while i < n:
        c = s[i]
        if c == '"' or c == "'":
            i = quoted_end(s, i); continue
        if c in '([{': depth += 1
        elif c in ')]}':
            if depth == 0:
                args.append(s[start:i]); return args, i
            depth -= 1
        elif c == ',' and depth == 0:
            args.append(s[start:i]); start = i + 1
        i += 1
    return args, n


def unescape(lit):
    return re.sub(r'\\(.)', lambda m: {'n': '\n', 't': '\t'}.get(m.group(1), m.group(1)), lit)


def fragments(fmt_arg):
    """The literal fragments of a format argument: string literals joined, a
    macro between them (PRId64) or a conversion specification splits."""
    parts = re.split(r'"((?:[^"\\]|\\.)*)"', fmt_arg)
    if len(parts) < 2:
        return None  # not a literal format
    text = []
    for k, p in enumerate(parts):
        if k % 2:
            text.append(unescape(p))
        elif p.strip():
            text.append('\0')  # a macro such as PRId64, or a ternary
    whole = ''.join(text)
    frags = [PREFIX.sub('', f.strip()).strip() for f in re.split(r'\0|\n|' + SPEC.pattern, whole)]
    return whole, [f for f in frags if len(f) >= MIN_FRAG]


def extract(root):
    files = []
    for d in SOURCES:
        for dp, _, fs in os.walk(os.path.join(root, d)):
            files += [os.path.join(dp, f) for f in fs if f.endswith(('.c', '.y', '.l'))]
    files += [os.path.join(root, t) for t in TOOLS]
    msgs = []
    for path in sorted(files):
        raw = open(path, encoding='utf-8', errors='replace').read()
        src = strip_comments(raw)
        rel = os.path.relpath(path, root)
        for m in CALL.finditer(src):
            name = m.group(1)
            if name in ('perr', 'LEXERR') and not rel.startswith('frontend/'):
                continue
            args, end = split_args(src, m.end())
            if name == 'fprintf':
                if not args or args[0].strip() != 'stderr':
                    continue
            k = REPORTERS[name]
            if len(args) <= k:
                continue  # the declaration or definition of a reporter
            got = fragments(args[k])
            if got is None:
                continue
            whole, frags = got
            line = src.count('\n', 0, m.start()) + 1
            # the call's lines, through the end of the statement's last line
            stop = src.find(';', end)
            stop = raw.find('\n', stop if stop >= 0 else end)
            span = raw[raw.rfind('\n', 0, m.start()) + 1:stop if stop >= 0 else len(raw)]
            mark = next((x for x in MARKS if x in span), None)
            if not mark and re.match(r'(?:\w+: )?internal error', whole):
                mark = 'internal by its own words'
            if name == 'fprintf' and not mark and re.search(r'warning:|\bTS_[A-Z_]+:', whole):
                mark = 'a warning or a test hook'  # the run goes on, or no user sets it
            msgs.append(dict(file=rel, line=line, fn=name, text=whole.strip(), frags=frags, mark=mark))
    return msgs


def tests_text(root):
    try:
        names = subprocess.run(['git', '-C', root, 'ls-files', '-z', 'tests'], capture_output=True,
                               check=True).stdout.decode().split('\0')
    except (OSError, subprocess.CalledProcessError):
        names = [os.path.relpath(os.path.join(dp, f), root) for dp, _, fs in os.walk(os.path.join(root, 'tests'))
                 for f in fs]
    out = []
    for n in names:
        p = os.path.join(root, n)
        if n and os.path.isfile(p) and not n.endswith('refusals_untested.txt'):
            with open(p, 'rb') as f:
                out.append(f.read().decode('utf-8', 'replace'))
    # C sources spell a quote as \" and a backslash as \\: search both forms
    t = '\n'.join(out).lower()
    return t + '\n' + t.replace('\\"', '"').replace("\\'", "'")


def key(m):
    """A message as the allow-list names it: its format text on one line."""
    return m['text'].replace('\n', '\\n').replace(' | ', ' \\| ')


def why_untested(m):
    t, f = m['text'], m['file']
    if re.search(r'GPU|cubin|PTX|NVRTC|CUDA|sm_%d', t):
        return 'needs a GPU or the CUDA toolchain (the device suites test the GPU paths)'
    if re.search(r'fork|pipe:|cannot make a job directory|own binary|MPI environment|cannot start', t):
        return 'a failing system call or launcher the suite cannot provoke'
    if f == 'plan/plan.c' and m['fn'] == 'rd_fail':
        return 'a plan damaged behind a valid checksum (the plan fuzzer reaches it; no golden case yet)'
    if f.startswith('api/tessera.c') or f.startswith('api/options.c'):
        return 'the C API (tests/api checks the calls, not yet this text)'
    return 'no golden test yet'


def read_allow(path):
    allow = []
    if path and os.path.exists(path):
        for ln, line in enumerate(open(path, encoding='utf-8'), 1):
            if line.strip() and not line.lstrip().startswith('#'):
                frag, _, why = line.rstrip('\n').rpartition(' | ')
                if not why.strip():
                    sys.exit(f'{path}:{ln}: no reason given (FRAGMENT | WHY UNTESTED)')
                allow.append(frag.strip())
    return allow


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('--root', default=os.path.dirname(here))
    ap.add_argument('--list', action='store_true', help='print every untested message (allowed ones too)')
    ap.add_argument('--all', action='store_true', help='print every message found, tested or not')
    ap.add_argument('--file', default='', help='only messages of files whose path contains this')
    ap.add_argument('--allow', default=None, help='allow-list (default tests/hostile/refusals_untested.txt)')
    ap.add_argument('--write-allow', metavar='FILE', help='write the untested messages as an allow-list')
    a = ap.parse_args()
    allow_path = a.allow if a.allow is not None else os.path.join(a.root, 'tests/hostile/refusals_untested.txt')
    msgs = [m for m in extract(a.root) if a.file in m['file']]
    tests = tests_text(a.root)
    allow = read_allow(allow_path)
    counted = [m for m in msgs if m['frags'] and not m['mark']]
    marked = [m for m in msgs if m['frags'] and m['mark']]
    # a fragment that many messages share ("(run 'mcc --help' for the
    # options)", "the sizes that divide it:") tells none of them apart: it
    # counts only for a message with nothing more particular
    freq = {}
    for m in counted:
        for f in set(m['frags']):
            freq[f] = freq.get(f, 0) + 1
    for m in counted:
        own = [f for f in m['frags'] if freq[f] <= 2] or m['frags']
        m['tested'] = any(f[:LONG].lower() in tests for f in own)
    untested = [m for m in counted if not m['tested']]
    allowed, new = [], []
    listed = set(allow)
    for m in untested:
        (allowed if key(m) in listed else new).append(m)
    keys = {key(m) for m in untested}
    stale = [f for f in allow if f not in keys]

    if a.all:
        for m in msgs:
            st = m['mark'] or ('tested' if m.get('tested') else 'UNTESTED' if m['frags'] else 'no text')
            print(f"{m['file']}:{m['line']}: [{st}] {m['text'][:100]!r}")
    if a.list:
        for m in untested:
            print(f"{m['file']}:{m['line']}: {m['text'][:110]!r}")
    if a.write_allow:
        with open(a.write_allow, 'w', encoding='utf-8') as f:
            f.write('# Refusals with no golden test yet (tools/refusal_audit.py --write-allow): one\n'
                    '# message (its format text) per line, then " | " the file and why it is untested.\n'
                    '# The list may only shrink: the audit fails on an untested refusal missing from\n'
                    '# it (a new one, or one whose text changed) and on a line that names none.\n')
            for m in untested:
                f.write(f"{key(m)} | {m['file']}: {why_untested(m)}\n")
    print(f'refusal audit: {len(counted)} refusals ({len(marked)} more marked internal or not a refusal), '
          f'{len(counted) - len(untested)} tested, {len(untested)} untested '
          f'({len(allowed)} on the allow-list {os.path.relpath(allow_path, a.root)})')
    if new:
        print(f'\n{len(new)} refusal(s) with no test and not on the allow-list: add a golden test '
              '(tests/hostile/*.cases) whose text is part of the message, or mark a message no user input '
              'reaches /* internal */', file=sys.stderr)
        for m in new:
            print(f"  {m['file']}:{m['line']}: {m['text'][:110]!r}", file=sys.stderr)
    if stale:
        print(f'\n{len(stale)} line(s) of the allow-list name no untested refusal (now tested or changed): '
              'remove them', file=sys.stderr)
        for f in stale:
            print(f'  {f}', file=sys.stderr)
    return 1 if (new or stale) else 0


if __name__ == '__main__':
    sys.exit(main())

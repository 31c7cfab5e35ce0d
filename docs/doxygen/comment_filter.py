#!/usr/bin/env python3
"""Doxygen's INPUT_FILTER for ibev's public headers (docs/doxygen/Doxyfile).

The headers document themselves in plain `//` comments; this turns them into
what Doxygen reads, on the fly, so the headers stay as they are:

  - the comment at the top of a header (up to its include guard) becomes the
    file's description (\\file); when it names its subject ("ibev::Device:
    ...") and that class has no comment of its own, the class gets it too,
    since that is where its guarantees (threads, lifetime) are written;
  - a comment block right above a declaration at namespace or class scope
    becomes that declaration's documentation (`///`); a block followed by a
    blank line, and every comment inside a function body, stays a comment;
  - a comment after an enumerator or a member on its line (and its
    continuation lines, aligned under it) documents that enumerator or
    member (`///<`);
  - the comment above an X-macro stats list (`#define IBEV_X_STATS(X)`)
    documents the struct that IBEV_DECLARE_STATS makes of it;
  - in documentation text: indented example lines become a \\code block;
    `<` and `>` outside `code spans` and quotes are entities (<b> in a
    comment is text, not bold); "e.g. " does not end a brief description.

Line numbers are kept: every line in is one line out, so Doxygen's warnings
point at the header's own lines.

  comment_filter.py HEADER     (prints the filtered header on stdout)
"""
import re
import sys

COMMENT = re.compile(r"^(\s*)//(?!/)(.*)$")
# A `//` comment after code on the same line (strings are blanked first).
TRAILING = re.compile(r"^(.*?\S)(\s*)//(?!/)(.*)$")
TYPE_HEAD = re.compile(
    r"^\s*(template\s*<.*>\s*)?(\[\[[^\]]*\]\]\s*)*(class|struct|union|enum|namespace)\b")
SUBJECT = re.compile(r"\bibev::([A-Z]\w*)")
STATS_LIST = re.compile(r"^#define IBEV_\w+_STATS\(X\)")
DECLARE_STATS = re.compile(r"^\s*IBEV_DECLARE_STATS\(")
ACCESS = re.compile(r"^\s*(public|private|protected)\s*:")
# Lines a comment above does not document.
NOT_DOCUMENTED = re.compile(r"^\s*(#(?!define\b)|}|static_assert\b|$)")
# Indented more than the text around it: an example.
EXAMPLE = re.compile(r"^ {3,}\S")


def blank_literals(code):
    """`code` with string and character literals and /* */ comments blanked,
    so that braces or slashes inside them are not taken for code."""
    code = re.sub(r'"(\\.|[^"\\])*"', lambda m: '"' + " " * (len(m.group(0)) - 2) + '"', code)
    code = re.sub(r"'(\\.|[^'\\])+'", lambda m: "'" + " " * (len(m.group(0)) - 2) + "'", code)
    return re.sub(r"/\*.*?\*/", lambda m: " " * len(m.group(0)), code)


def escape_text(text, in_span):
    """Writes `<` and `>` outside `code spans` and "quotes" as entities (a
    `<b>` or `<ibev/core/handle.h>` in a comment is text), and escapes the
    dot of "e.g." and "i.e."; returns the text and whether a code span is
    still open at its end (spans may cross lines)."""
    out = []
    in_quotes = False  # Doxygen takes "..." as it is: an escape would show
    for char in text:
        if char == "`":
            in_span = not in_span
        elif char == '"' and not in_span:
            in_quotes = not in_quotes
        elif not in_span and not in_quotes and char in "<>":
            # An entity, not \<: Doxygen takes \<b\> for a tag all the same.
            char = "&lt;" if char == "<" else "&gt;"
        out.append(char)
    text = "".join(out)
    text = re.sub(r"\b(e\.g|i\.e)\. ", r"\1.\\ ", text)
    return text, in_span


def doc_lines(indent, texts, marker="///"):
    """`texts` (comment bodies without `//`) as documentation lines, as many.
    An example (a run of lines indented more than the text) is framed by
    \\code and \\endcode, which Doxygen wants on lines of their own: the
    empty comment lines around it (or, failing those, its own first and last
    lines)."""
    out = []
    in_span = False
    i = 0
    while i < len(texts):
        if EXAMPLE.match(texts[i]):
            j = i
            while j < len(texts) and EXAMPLE.match(texts[j]):
                j += 1
            block = [t[1:] for t in texts[i:j]]
            if out and texts[i - 1].strip() == "":
                out[-1] = f"{indent}{marker} \\code{{.cpp}}"
            else:
                block[0] = "\\code{.cpp} " + block[0].lstrip()
            close_alone = j < len(texts) and texts[j].strip() == ""
            if not close_alone:
                block[-1] += " \\endcode"
            out.extend(f"{indent}{marker}{line}" for line in block)
            if close_alone:
                out.append(f"{indent}{marker} \\endcode")
                j += 1
            i = j
            continue
        text, in_span = escape_text(texts[i], in_span)
        out.append(f"{indent}{marker}{text}")
        i += 1
    return out


def function_name(line):
    """The name a declaration line declares a function of, or None."""
    match = re.search(r"(~?\b\w+)\s*\(", blank_literals(line))
    if not match or match.group(1) in ("operator", "static_assert", "decltype"):
        return None
    return match.group(1)


def subjects(file_comment):
    """The classes a header's opening comment is about: those it names with
    ibev:: in its first sentence ("ibev::CompletionChannel and
    ibev::CompletionQueue.")."""
    first = " ".join(t.strip() for t in file_comment)
    first = re.split(r"[.:](\s|$)", first, maxsplit=1)[0]
    return set(SUBJECT.findall(first))


class Scopes:
    """Which scope each line is in: namespace, class/struct/enum (where
    comments document), or a function body or initializer (where they do
    not)."""

    def __init__(self):
        self.stack = []
        self.head = ""  # the statement so far, to tell what a `{` opens

    def documentable(self):
        return all(kind == "decl" for kind in self.stack)

    def feed(self, code):
        code = blank_literals(code).split("//", 1)[0]
        if code.lstrip().startswith("#"):
            return
        if ACCESS.match(code):
            code = ACCESS.sub("", code)
            self.head = ""
        for char in code + " ":
            if char == "{":
                opens_type = self.documentable() and TYPE_HEAD.match(self.head)
                self.stack.append("decl" if opens_type else "body")
                self.head = ""
            elif char == "}":
                if self.stack:
                    self.stack.pop()
                self.head = ""
            elif char == ";":
                self.head = ""
            else:
                self.head += char


def filter_header(lines, source_name):
    out = list(lines)
    n = len(lines)

    # The opening comment: the file's description. \file goes at the end of
    # its first line (on a line of its own it would take that line's text
    # for the file's name).
    top = 0
    while top < n and COMMENT.match(lines[top]):
        top += 1
    file_texts = [COMMENT.match(line).group(2) for line in lines[:top]]
    if top:
        out[:top] = doc_lines("", file_texts)
        out[0] += " \\file"
    wanted = subjects(file_texts)

    scopes = Scopes()
    pending = []  # (line index, indent, text) of the comment block above
    held_stats = None  # a stats list's comment, for IBEV_DECLARE_STATS
    overloads = None  # (name, depth, text) of the function documented last
    trailing_column = None  # column of the `///<` on the line above
    i = top
    while i < n:
        line = lines[i]
        comment = COMMENT.match(line)
        if comment:
            column = len(comment.group(1))
            if trailing_column is not None and column == trailing_column and not pending:
                # Continues the trailing comment of the line above.
                text, _ = escape_text(comment.group(2), False)
                out[i] = f"{comment.group(1)}///<{text}"
                i += 1
                continue
            trailing_column = None
            overloads = None
            pending.append((i, comment.group(1), comment.group(2)))
            i += 1
            continue
        trailing_column = None
        prefix = ""  # documentation put before the line, on the line itself
        if not line.strip():
            overloads = None
        elif overloads and not pending and not scopes.head.strip() \
                and len(scopes.stack) == overloads[1]:
            # A statement right below the documented one: an overload of it
            # (attach(ibv_cq*, ...), attach(ibv_qp*, ...)) shares its comment.
            name = overloads[0]
            copy_or_move = re.search(rf"\(\s*(const\s+{name}\s*&|{name}\s*&&)", line)
            if function_name(line) == name and "= delete" not in line and not copy_or_move:
                prefix = f"/** {overloads[2]} */ "
            else:
                overloads = None

        if pending:
            first, indent, _ = pending[0]
            texts = [t for _, _, t in pending]
            if STATS_LIST.match(line):
                held_stats = (indent, texts)
            elif scopes.documentable() and not NOT_DOCUMENTED.match(line) and not ACCESS.match(line):
                out[first:first + len(pending)] = doc_lines(indent, texts)
                if function_name(line) and not any(EXAMPLE.match(t) or "*/" in t for t in texts):
                    joined, _ = escape_text(" ".join(t.strip() for t in texts), False)
                    overloads = (function_name(line), len(scopes.stack), joined)
            pending = []
        elif wanted and scopes.documentable():
            # The subject class, with no comment of its own: the file's.
            match = re.match(r"^\s*(?:class|struct)\s+(?:\[\[\w+\]\]\s+)?(\w+)\b(?!.*;\s*$)", line) \
                or re.match(r"^\s*using\s+(\w+)\s*=", line)
            if match and match.group(1) in wanted:
                wanted.discard(match.group(1))
                prefix = f"/** \\copydoc {source_name} */ "
        if held_stats and DECLARE_STATS.match(line) and not any("*/" in t for t in held_stats[1]):
            text, _ = escape_text(" ".join(t.strip() for t in held_stats[1]), False)
            prefix = f"/** {text} */ "
            held_stats = None

        body = line
        trailing = TRAILING.match(blank_literals(line))
        if trailing and scopes.documentable() and not line.lstrip().startswith("#"):
            code = trailing.group(1).rstrip()
            if code.endswith((",", ";")) or (scopes.stack and re.match(r"^\s*k\w+$", code)):
                start = len(trailing.group(1)) + len(trailing.group(2))
                text, _ = escape_text(line[start + 2:], False)
                body = line[:start] + "///<" + text
                trailing_column = start  # the next line is compared as written
        if prefix:
            body = body[:len(body) - len(body.lstrip())] + prefix + body.lstrip()
        out[i] = body
        scopes.feed(line)
        i += 1
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: comment_filter.py HEADER")
    path = sys.argv[1]
    with open(path, encoding="utf-8") as header:
        text = header.read().split("\n")
    # Doxygen passes the path it was given; the file's name in the reference
    # is what follows the last ibev/ (dispatch/dispatcher.h).
    name = path.rsplit("/ibev/", 1)[-1] if "/ibev/" in path else path
    sys.stdout.write("\n".join(filter_header(text, name)))

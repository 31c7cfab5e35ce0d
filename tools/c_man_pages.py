#!/usr/bin/env python3
"""Writes the C API's section 3 manual pages from <ibev/ibev_c.h>'s comments.

    c_man_pages.py IBEV_C_H VERSION_H DATE_PAGE OUTDIR [--list]

The header is the reference: its opening comment becomes ibev_c(3), and each
"// ---- NAME" part of it a page ibev_c_NAME(3) (lower case, spaces as
"_"), whose SYNOPSIS is the part's declarations and whose DESCRIPTION is
each comment with what it comments. The names are ibev_c*: the C types share their names
with the C++ classes' pages (ibev_dispatcher(3) is ibev::Dispatcher), so no
page is named after one. Every function a part declares is in its page's NAME
line, so that `man ibev_dispatcher_create` finds it once mandb has run.
The pages' date is DATE_PAGE's .TH date (ibev.7: the library's pages are of
one date); the version is version.h's. With --list, prints the page names the
header makes and writes nothing (docs/BUILD.bazel's genrule lists them: a
part added to the header fails its test until it is listed there).

The CMake build runs it at configure time (installing the pages with the
-dev package); //tests/docs runs it on the header as it is, so the pages
cannot drift from it.
"""

import os
import re
import sys

# A part's name is words (an acronym as written: "CM ids"); its page's is
# lower case.
SECTION = re.compile(r"^// -{3,} ([A-Za-z][A-Za-z ]*)$")
FUNCTION = re.compile(r"\b(ibev_[a-z0-9_]+)\s*\(")


def escape(text):
    """Text for a roff line: backslashes and leading control characters."""
    text = text.replace("\\", "\\e")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def prose(text):
    """A comment's words: `code` in bold, the rest as written."""
    return re.sub(r"`([^`]+)`", lambda m: "\\fB" + m.group(1) + "\\fR", escape(text))


def read_parts(header):
    """(opening comment lines, [(part name, lines)]) of the header's C body."""
    with open(header, encoding="utf-8") as f:
        lines = f.read().splitlines()
    opening = []
    for line in lines:
        if not line.startswith("//"):
            break
        opening.append(line[2:].strip())
    begin = lines.index('extern "C" {') + 1
    end = max(i for i, line in enumerate(lines) if line.strip() == "#ifdef __cplusplus")
    parts = [("", [])]
    for line in lines[begin:end]:
        match = SECTION.match(line)
        if match:
            parts.append((match.group(1), []))
        elif line.strip() != "#endif":
            parts[-1][1].append(line)
    return opening, parts


def chunks(lines):
    """[(comment lines, code lines)]: each comment with the code after it."""
    result = []
    comment, code = [], []
    for line in lines + [""]:
        stripped = line.strip()
        is_comment = stripped.startswith("//")
        if (is_comment and code) or (not stripped and (comment or code)):
            result.append((comment, code))
            comment, code = [], []
        if is_comment:
            comment.append(stripped[2:].strip())
        elif stripped:
            code.append(line.rstrip())
    return result


def paragraphs(comment):
    """A comment's lines as paragraphs: a blank comment line separates them."""
    text, out = [], []
    for line in comment + [""]:
        if line:
            text.append(line)
        elif text:
            out.append(" ".join(text))
            text = []
    return out


def typedefs(code):
    """The names a declaration block declares besides functions."""
    names = re.findall(r"^(?:struct|enum) (ibev_[a-z0-9_]+) \{", "\n".join(code), re.M)
    names += re.findall(r"^typedef .*?\b(ibev_[a-z0-9_]+)\)?\s*[;(]", "\n".join(code), re.M)
    return names


def functions(code):
    """The functions declared (not the function pointers of a struct, nor a
    function a field's trailing comment mentions)."""
    text = "\n".join(line.split("//")[0] for line in code)
    return [name for name in FUNCTION.findall(text) if not re.search(r"\(\*\s*" + name, text)]


def page(names, description, synopsis, body, see_also, version, date):
    name = names[0]
    out = [
        '.\\" %s(3): written by tools/c_man_pages.py from capi/ibev_c.h, whose' % name,
        '.\\" comments are the reference; do not edit. Installed with the -dev',
        '.\\" package and checked by //tests/docs:man_pages_test and c_man_pages_test.',
        ".nr HY 0",
        '.TH %s 3 "%s" "ibev %s" "ibev Programmer\'s Manual"' % (name.upper(), date, version),
        ".nh",
        ".ad l",
        ".SH NAME",
        "%s \\- %s" % (", ".join(names), description),
        ".SH SYNOPSIS",
        ".nf",
        ".B #include <ibev/ibev_c.h>",
        ".fi",
    ]
    if synopsis:
        out += [".PP", ".EX"] + [escape(line) for line in synopsis] + [".EE"]
    out += [".SH DESCRIPTION"] + body
    out += [".SH SEE ALSO"]
    refs = [".BR %s (3)" % ref for ref in see_also] + [".BR ibev (7)"]
    out += [ref + "," for ref in refs[:-1]] + [refs[-1]]
    return "\n".join(out) + "\n"


def main(argv):
    listing = "--list" in argv
    argv = [a for a in argv if a != "--list"]
    if len(argv) != 5:
        sys.exit("usage: c_man_pages.py IBEV_C_H VERSION_H DATE_PAGE OUTDIR [--list]")
    header, version_h, date_page, outdir = argv[1:]
    with open(version_h, encoding="utf-8") as f:
        numbers = dict(re.findall(r"#define IBEV_VERSION_(MAJOR|MINOR|PATCH) (\d+)", f.read()))
    version = "%s.%s.%s" % (numbers["MAJOR"], numbers["MINOR"], numbers["PATCH"])
    with open(date_page, encoding="utf-8") as f:
        date = re.search(r'^\.TH \S+ \d "([0-9-]+)"', f.read(), re.M).group(1)

    opening, parts = read_parts(header)
    named = [(part, "ibev_c_" + part.lower().replace(" ", "_"), lines) for part, lines in parts if part]
    if listing:
        print("ibev_c.3")
        for _, name, _ in named:
            print(name + ".3")
        return
    os.makedirs(outdir, exist_ok=True)
    pages = {}

    # ibev_c(3): the opening comment (errors, threads, lifetime), the
    # declarations before the first part, and the parts' pages.
    first = [line for line in parts[0][1] if line.strip()]
    intro_code = [line for line in first if not line.strip().startswith("//")]
    body = []
    for text in paragraphs(opening[1:]):
        body += [".PP", prose(text)]
    for comment, code in chunks(parts[0][1]):
        if comment and functions(code):
            body += [".TP", '.B "%s"' % ", ".join(f + "()" for f in functions(code))]
            body += [prose(" ".join(comment))]
    body += [".SS Pages"]
    for part, name, lines in named:
        declared = [f for _, code in chunks(lines) for f in functions(code)]
        body += [".TP", ".BR %s (3)" % name,
                 prose(part[0].upper() + part[1:] + (": " + ", ".join(declared) if declared else "")
                       + ".")]
    names = ["ibev_c"] + functions(intro_code)
    pages["ibev_c"] = page(names,
                           "ibev for C programs: errors, threads and lifetime, and the pages",
                           intro_code, body, [name for _, name, _ in named], version, date)

    for part, name, lines in named:
        synopsis, body, declared = [], [], []
        for comment, code in chunks(lines):
            if code:
                synopsis += code + [""]
            declared += functions(code)
            if not comment:
                continue
            heads = [h + "()" for h in functions(code)] or typedefs(code)
            body += [".TP", '.B "%s"' % ", ".join(heads)] if heads else [".PP"]
            for i, text in enumerate(paragraphs(comment)):
                body += ([] if i == 0 else [".IP"]) + [prose(text)]
        while synopsis and not synopsis[-1]:
            synopsis.pop()
        others = ["ibev_c"] + [n for _, n, _ in named if n != name]
        pages[name] = page([name] + declared, "ibev's C API: " + part, synopsis, body,
                           others, version, date)

    for name, text in pages.items():
        with open(os.path.join(outdir, name + ".3"), "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main(sys.argv)

#!/usr/bin/python3
"""The heap blocks ibev keeps per QP+CQ pair, from valgrind's DHAT.

Reads the JSON that `valgrind --tool=dhat` wrote for `softroce_bench
memory-blocks --pairs N` (which exits holding N pairs and frees nothing) and
prints one line per place in ibev that made blocks still live at exit:

  block made_by=FUNCTION asked=BYTES chunk=BYTES per_pair=BLOCKS

`asked` is the size requested, `chunk` what glibc's malloc takes for it (its
8-byte header, rounded up to 16, at least 32). A block counts as ibev's when
the first frame above the allocator is ibev's own code; rdma-core's blocks
(the baseline's too) and the benchmark's are left out. Places that made
fewer than one block per two pairs (tables, lists, what the program made
once) are left out: the report puts them with the rest of the headline.
"""
import json
import re
import sys

ALLOCATOR = re.compile(r"^(operator new|malloc|calloc|realloc|memalign|posix_memalign|"
                       r"aligned_alloc)\b")
# Library plumbing between the allocator and the function that asked.
PLUMBING = re.compile(r"^(std::|__gnu_cxx::|void std::|ibev::detail::ReleasedBy)")


def function_name(frame):
    text = re.sub(r"^0x[0-9A-Fa-f]+: ", "", frame)
    text = re.sub(r" \((?:in|at) [^)]*\)$", "", text)
    return text


def short_name(name):
    # Drop the parameter list and template arguments: "ibev::X::create".
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).split(" ")[-1] or name


def chunk(asked):
    return max(32, (asked + 8 + 15) // 16 * 16)


def main(path, pairs):
    data = json.load(open(path))
    frames = data["ftbl"]
    made = {}
    for pp in data["pps"]:
        blocks, live = pp.get("ebk", 0), pp.get("eb", 0)
        if blocks * 2 < pairs:
            continue
        names = [function_name(frames[i]) for i in pp["fs"]]
        caller = next((n for n in names if not ALLOCATOR.match(n) and not PLUMBING.match(n)),
                      "?")
        if not caller.startswith("ibev::"):
            continue
        key = (short_name(caller), live // blocks)
        made[key] = made.get(key, 0) + blocks
    for (who, asked), blocks in sorted(made.items(), key=lambda kv: -kv[0][1] * kv[1]):
        print(f"block made_by={who} asked={asked} chunk={chunk(asked)} "
              f"per_pair={blocks / pairs:.2f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

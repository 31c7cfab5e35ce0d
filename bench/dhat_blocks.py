#!/usr/bin/python3
"""The heap blocks ibev keeps per QP+CQ pair, from valgrind's DHAT.

Reads the JSON that `valgrind --tool=dhat` wrote for `softroce_bench
memory-blocks --pairs N`, which makes N pairs and one more first (first use,
as `memory` does), then exits freeing nothing, and prints what was live then:

  block made_by=FUNCTION asked=BYTES chunk=BYTES per_pair=BLOCKS
  dhat places=P ibev_places=Q listed_bytes_per_pair=B ibev_unlisted_bytes_per_pair=U
       other_bytes_per_pair=O

A `block` line is one place in ibev that made at least one block per two
pairs, all of one size (a place whose blocks differ in size is summed with
the unlisted, its chunks estimated from their mean size): `asked` is the size requested, `chunk` what glibc's malloc takes for
it (its 8-byte header, rounded up to 16, at least 32; glibc's request2size).
A place counts as ibev's when the first frame above the allocator and the
standard library is ibev's own code. The `dhat` line says how many places
held live blocks, how many were ibev's, and the live bytes per pair in the
listed blocks, in ibev's other places (tables, lists, what was made once)
and in everyone else's (rdma-core's objects, the benchmark's own), all by
chunk, so that a report can tell "nothing attributed" from "no run".
"""
import json
import re
import sys

ALLOCATOR = re.compile(r"^(operator new|malloc|calloc|realloc|memalign|posix_memalign|"
                       r"aligned_alloc)\b")
# Library plumbing between the allocator and the function that asked; tested
# on the name without its return type.
PLUMBING = re.compile(r"^(std::|__gnu_cxx::|ibev::detail::ReleasedBy)")
QUALIFIERS = re.compile(r"(\s+(const|volatile|noexcept|&&|&))+$")


def function_name(frame):
    text = re.sub(r"^0x[0-9A-Fa-f]+: ", "", frame)
    return re.sub(r" \((?:in [^)]*|[^()]*:\d+)\)$", "", text)


def strip_templates(name):
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def qualified_name(name):
    """"std::shared_ptr<X> ibev::A::make<T>(int) const" -> "ibev::A::make"."""
    bare = QUALIFIERS.sub("", strip_templates(name).strip())
    return bare.split(" ")[-1] if bare else name


def chunk(asked):
    return max(32, (asked + 8 + 15) // 16 * 16)


def main(path, pairs_made):
    pairs = pairs_made + 1  # the first-use pair is live too
    data = json.load(open(path))
    frames = data["ftbl"]
    made = {}
    places = ibev_places = 0
    unlisted = other = 0
    for pp in data["pps"]:
        blocks, live = pp.get("ebk", 0), pp.get("eb", 0)
        if blocks == 0:
            continue
        places += 1
        names = [function_name(frames[i]) for i in pp["fs"]]
        caller = next((qualified_name(n) for n in names
                       if not ALLOCATOR.match(n) and not PLUMBING.match(qualified_name(n))), "?")
        asked = live // blocks  # every block of a place below is one size
        if not caller.startswith("ibev::"):
            other += chunk(asked) * blocks
            continue
        ibev_places += 1
        if blocks * 2 < pairs or live % blocks != 0:
            unlisted += chunk(asked) * blocks
            continue
        made[(caller, asked)] = made.get((caller, asked), 0) + blocks
    listed = 0
    for (who, asked), blocks in sorted(made.items(), key=lambda kv: -chunk(kv[0][1]) * kv[1]):
        listed += chunk(asked) * blocks
        print(f"block made_by={who} asked={asked} chunk={chunk(asked)} "
              f"per_pair={blocks / pairs:.2f}")
    print(f"dhat places={places} ibev_places={ibev_places} "
          f"listed_bytes_per_pair={listed / pairs:.0f} "
          f"ibev_unlisted_bytes_per_pair={unlisted / pairs:.0f} "
          f"other_bytes_per_pair={other / pairs:.0f}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

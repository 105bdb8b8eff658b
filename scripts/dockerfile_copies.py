#!/usr/bin/env python3
"""Checks that a Dockerfile's builder stage copies in every file of this repository that a
binary built outside it was compiled from, and every workspace member's manifest (cargo reads
them all before it builds anything), so that the stage would compile the same binary.

    python3 scripts/dockerfile_copies.py BINARY.d DOCKERFILE

BINARY.d is the dep-info cargo writes beside the binary (Make syntax, `binary: file file ...`);
the sources are the COPY lines without --from (a folder covers everything under it). Used by
scripts/test-container.sh and scripts/test-container-cuda.sh, whose images carry a binary the
test command built once on this machine instead of compiling it again inside.
"""
import os
import sys
import tomllib


def main(depinfo, dockerfile):
    root = os.getcwd() + "/"
    sources = set()
    for line in open(dockerfile):
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources.update(os.path.normpath(w) for w in words[1:-1])
    # No path of this repository has a space, so Make's escapes never occur.
    files = open(depinfo).read().split(":", 1)[1].split()
    inside = [f[len(root) :] for f in files if f.startswith(root) and not f.startswith(root + "target/")]
    members = tomllib.load(open("Cargo.toml", "rb")).get("workspace", {}).get("members", [])
    inside += [os.path.join(member, "Cargo.toml") for member in members]
    missing = sorted(f for f in inside if not any(f == s or f.startswith(s + "/") for s in sources))
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        sys.exit(f"{dockerfile} does not copy files the build of the binary reads: {shown}")
    print(f"{dockerfile} copies every file of this repository the build of the binary reads ({len(inside)})")


if __name__ == "__main__":
    main(*sys.argv[1:3])

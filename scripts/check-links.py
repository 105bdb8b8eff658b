#!/usr/bin/env python3
"""Fails when a relative link or an anchor in the repository's Markdown does not resolve.

Checks README.md and every Markdown file under docs/, examples/, benches/, configs/ and
scripts/: `[text](path)`, `[text](path#anchor)` and `[text](#anchor)` links (and reference-style
`[label]: path` definitions). A path must exist in the repository (relative to the file that
links it), may not leave the repository, and an anchor must be a heading of the target file as
GitHub slugs it (lowercase; punctuation but `-` and `_` dropped; spaces to `-`; repeats get
`-1`, `-2`, …) or an explicit `<a id="…">`. Links with a scheme (https:, mailto:) are left alone.

    scripts/check-links.py        # exit 1 and one line per broken link
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ["docs", "examples", "benches", "configs", "scripts", "tests/fixtures", "tests/protocols", "fuzz"]
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+(\S+)", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def markdown_files():
    files = [os.path.join(ROOT, "README.md")]
    for folder in FOLDERS:
        for base, dirs, names in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if d not in ("target", "corpus", "node_modules")]
            files += [os.path.join(base, n) for n in names if n.endswith(".md")]
    return sorted(f for f in files if os.path.exists(f))


def slug(heading):
    text = re.sub(r"<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path, cache={}):
    if path not in cache:
        text = FENCE.sub("", open(path, encoding="utf-8").read())
        seen, found = {}, set()
        for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
            base = slug(heading)
            n = seen.get(base, 0)
            found.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
        found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
        cache[path] = found
    return cache[path]


def check(path):
    text = open(path, encoding="utf-8").read()
    prose = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = LINK.findall(prose) + IMAGE.findall(prose) + REFERENCE.findall(prose)
    problems = []
    for target in targets:
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        where = os.path.relpath(path, ROOT)
        if not resolved.startswith(ROOT + os.sep) and resolved != ROOT:
            problems.append(f"{where}: {target}: leaves the repository")
        elif not os.path.exists(resolved):
            problems.append(f"{where}: {target}: no such file")
        elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
            problems.append(f"{where}: {target}: no heading #{anchor} in {os.path.relpath(resolved, ROOT)}")
    return problems


def main():
    files = markdown_files()
    problems = [p for f in files for p in check(f)]
    for p in problems:
        print(p)
    print(f"check-links: {len(files)} Markdown files, {len(problems)} broken link(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

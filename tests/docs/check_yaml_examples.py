#!/usr/bin/env python3
"""Checks every ```yaml block of loom's Markdown with `loom config show`.

A block is a config fragment unless an HTML comment on the line before its fence says otherwise:

  (no marker)                           a fragment: merged onto configs/quickstart.yaml, the
                                        result must validate
  <!-- yaml-check: fragment on PATH --> a fragment merged onto PATH (a config of the repository)
  <!-- yaml-check: config PATH -->      a whole config file, written as PATH in a scratch copy of
                                        configs/ (so its base_config and !include paths resolve
                                        there); it must validate
  <!-- yaml-check: file PATH -->        a file written as PATH in the scratch copy, for a later
                                        block to include; not validated by itself
  <!-- yaml-check: same-as PATH -->     the repository's file PATH, comments aside (checked
                                        where that file is used)
  <!-- yaml-check: skip REASON -->      not checked; the reason says why

Usage: check_yaml_examples.py LOOM PLUGIN_DIR SOURCE_DIR WORK_DIR [FILE.md...]
Without files it checks README.md, docs/*.md and the READMEs of plugins/ and sdk/examples/. Prints one line per block and, for each failure, the Markdown file and line with loom's message.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*yaml-check:\s*(.*?)\s*-->\s*$")


def yaml_blocks(path):
    """(line of the fence, marker text or None, block text) for each ```yaml block of `path`."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        start = i
        i += 1
        body = []
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1  # the closing fence
        if lang != "yaml":
            continue
        marker = None
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        if j >= 0:
            mm = MARKER.match(lines[j])
            if mm:
                marker = mm.group(1)
        blocks.append((start + 1, marker, "\n".join(body) + "\n"))
    return blocks


def significant_lines(text):
    return [l.rstrip() for l in text.split("\n") if l.strip() and not l.lstrip().startswith("#")]


def main():
    if len(sys.argv) < 5:
        print(__doc__)
        return 2
    loom, plugin_dir, source, work = (os.path.abspath(a) for a in sys.argv[1:5])
    files = sys.argv[5:]
    if not files:
        for pattern in ("README.md", "docs/*.md", "plugins/*/*/README.md", "sdk/examples/*/README.md"):
            files += sorted(glob.glob(os.path.join(source, pattern)))
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(os.path.join(source, "configs"), os.path.join(work, "configs"))
    os.makedirs(os.path.join(work, "fragments"))

    def show(config):
        r = subprocess.run([loom, "config", "show", config, "--no-default-plugin-path", "--plugin-path", plugin_dir],
                           capture_output=True, text=True, cwd=work)
        return r.returncode, r.stderr.strip() or r.stdout.strip()

    failures = []
    checked = 0
    for md in files:
        rel = os.path.relpath(md, source)
        for line, marker, text in yaml_blocks(md):
            where = f"{rel}:{line}"
            words = (marker or "fragment").split(None, 1)
            kind, arg = words[0], (words[1] if len(words) > 1 else "")
            if kind == "skip":
                if not arg:
                    failures.append((where, "a skipped block needs a reason: <!-- yaml-check: skip REASON -->"))
                    continue
                print(f"skipped {where}: {arg}")
                continue
            checked += 1
            if kind == "fragment":
                base = os.path.join(source, "configs", "quickstart.yaml")
                if arg:
                    if not arg.startswith("on "):
                        failures.append((where, f"unknown marker 'fragment {arg}' (expected 'fragment on PATH')"))
                        continue
                    base = os.path.join(source, arg[3:].strip())
                if re.search(r"^base_config\s*:", text, re.M):
                    failures.append((where, "a fragment has no base_config of its own: mark it "
                                            "<!-- yaml-check: config PATH -->"))
                    continue
                config = os.path.join(work, "fragments", f"{rel.replace(os.sep, '_')}-{line}.yaml")
                with open(config, "w", encoding="utf-8") as f:
                    f.write(f"base_config: {base}\n{text}")
            elif kind in ("config", "file"):
                if not arg:
                    failures.append((where, f"'{kind}' needs the path the block is written as"))
                    continue
                config = os.path.join(work, arg)
                os.makedirs(os.path.dirname(config), exist_ok=True)
                with open(config, "w", encoding="utf-8") as f:
                    f.write(text)
                if kind == "file":
                    print(f"written {where} as {arg}")
                    continue
            elif kind == "same-as":
                try:
                    with open(os.path.join(source, arg), encoding="utf-8") as f:
                        original = f.read()
                except OSError as e:
                    failures.append((where, f"same-as {arg}: {e}"))
                    continue
                if significant_lines(original) != significant_lines(text):
                    failures.append((where, f"differs from {arg}"))
                else:
                    print(f"ok      {where} (same as {arg})")
                continue
            else:
                failures.append((where, f"unknown marker 'yaml-check: {marker}'"))
                continue
            rc, message = show(config)
            if rc == 0:
                print(f"ok      {where}")
            else:
                failures.append((where, f"`loom config show` exited {rc}:\n{message}"))
    for where, why in failures:
        print(f"FAILED  {where}: {why}")
    if checked == 0:
        print("no yaml blocks found: is the list of files right?")
        return 1
    print(f"{checked} blocks checked, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

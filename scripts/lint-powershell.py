#!/usr/bin/env python3
"""Syntax check of PowerShell scripts on machines without PowerShell.

Parses each file with the tree-sitter PowerShell grammar (PyPI: tree-sitter,
tree-sitter-powershell) and fails on any syntax error or missing token, naming the file, line
and column. This is a grammar check, not PowerShell's own parser: it catches unbalanced braces,
parentheses and quotes, broken here-strings and malformed statements, but not unknown cmdlets or
parameters. Usage: lint-powershell.py FILE.ps1...
"""

import sys

import tree_sitter
import tree_sitter_powershell


def problems(node, out):
    """Collects ERROR and MISSING nodes under `node`."""
    if node.is_error or node.is_missing:
        out.append(node)
        return
    for child in node.children:
        problems(child, out)


def main(paths):
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_powershell.language()))
    failed = False
    for path in paths:
        with open(path, "rb") as f:
            source = f.read()
        if source.startswith(b"\xef\xbb\xbf"):
            source = source[3:]
        tree = parser.parse(source)
        found = []
        problems(tree.root_node, found)
        if not found and tree.root_node.has_error:
            found.append(tree.root_node)
        for node in found:
            failed = True
            line, column = node.start_point
            what = f"missing {node.type}" if node.is_missing else "syntax error"
            text = source[node.start_byte:node.end_byte].decode("utf-8", "replace")
            text = text.splitlines()[0][:60] if text else ""
            print(f"{path}:{line + 1}:{column + 1}: {what} near {text!r}")
        if not found:
            print(f"{path}: ok")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))

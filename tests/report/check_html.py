"""Checks that an HTML report is well formed enough for any browser: Python's html.parser sees every
non-void tag closed in order, and each inline <svg> parses as XML on its own.

usage: check_html.py FILE  ->  {"errors": [...], "svg_count": n, "table_count": n, "script_tags": n}
"""
import json
import re
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class TagBalance(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack = []
        self.errors = []
        self.counts = {}

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag not in VOID:
            self.stack.append((tag, self.getpos()))

    def handle_startendtag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1  # <rect .../>: opened and closed

    def handle_endtag(self, tag):
        if not self.stack:
            self.errors.append(f"</{tag}> at {self.getpos()} closes nothing")
        elif self.stack[-1][0] != tag:
            open_tag, pos = self.stack[-1]
            self.errors.append(f"</{tag}> at {self.getpos()} but <{open_tag}> from {pos} is open")
        else:
            self.stack.pop()


def main():
    text = open(sys.argv[1], encoding="utf-8").read()
    parser = TagBalance()
    parser.feed(text)
    parser.close()
    errors = list(parser.errors)
    errors += [f"<{tag}> from {pos} is never closed" for tag, pos in parser.stack]
    svgs = re.findall(r"<svg\b.*?</svg>", text, flags=re.S)
    for i, svg in enumerate(svgs):
        try:
            ET.fromstring(svg)
        except ET.ParseError as e:
            errors.append(f"svg {i} is not XML: {e}")
    print(json.dumps({
        "errors": errors,
        "svg_count": len(svgs),
        "table_count": parser.counts.get("table", 0),
        "script_tags": parser.counts.get("script", 0),
    }))


if __name__ == "__main__":
    main()

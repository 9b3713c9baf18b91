"""report.html: report.md rendered by a CommonMark renderer (markdown-it-py, tables on, raw HTML
off) into one self-contained page, the figures inlined as base64 PNGs."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping

from markdown_it import MarkdownIt

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1100px;margin:1.5em auto;padding:0 1em;
     color:#222;line-height:1.45}
h1{margin:.2em 0 .6em}h2{margin-top:1.8em;border-bottom:1px solid #ddd}
code{background:#f3f3f3;padding:0 .25em;border-radius:3px;font-size:90%}
table{border-collapse:collapse;margin:.8em 0;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
blockquote{margin:.6em 0;padding:.2em .8em;border-left:4px solid #e0a800;background:#fff8e1}
.headline{background:#f6f9fc;border:1px solid #d6e2ee;border-radius:6px;padding:.4em 1em}
.headline td,.headline th{text-align:left}
figure{display:inline-block;margin:1em}img{max-width:100%}
"""
# the first screen is everything before this heading (headline_md in the markdown)
HEADLINE_END = "<h2>"


def render_markdown(md_text: str) -> str:
    """CommonMark + GFM tables to HTML; raw HTML in the text is escaped, not passed through."""
    return MarkdownIt("commonmark", {"html": False}).enable("table").render(md_text)


def html_page(md_text: str, figures: Mapping[str, bytes], title: str, names: Mapping[str, str] | None = None) -> str:
    """A self-contained page of ``md_text``: images that name a figure file (``names``: figure ->
    file name, as in the markdown) get the PNG inlined, and the part before the first ``##``
    section (the first screen's answers) is boxed."""
    for name, png in figures.items():
        fname = (names or {}).get(name, f"{name}.png")
        md_text = md_text.replace(f"]({fname})", f"](data:image/png;base64,{base64.b64encode(png).decode()})")
    body = render_markdown(md_text)
    head, sep, rest = body.partition(HEADLINE_END)
    if sep and "</h1>" in head:
        title_html, _, first = head.partition("</h1>")
        body = f'{title_html}</h1><section class="headline">{first}</section>{sep}{rest}'
    return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")

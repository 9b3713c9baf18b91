"""report.html as a reader sees it: a real `hir evaluate` report (the hand-built tiny graph, a
contract-shaped export) loaded in headless Chromium (Debian's `chromium`; `make test` installs it,
this test is skipped without it). Markdown must be rendered, not shown (no ``**`` or backticks in
the text, nested lists as lists, tables as tables), every figure must decode, and the first
screen must answer the three questions: did HIR help ranking, did it help retrieval, where are
the outputs."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from hir_evaluation import stage
from tests.evaluation.fixtures import write_export
from tests.evaluation.test_stage import FAST, TINY_TASK

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# the flags of a headless, offline, throwaway browser (root needs --no-sandbox)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]
WIDTH, HEIGHT = 1280, 1000  # one laptop screen
# run in the page after layout: what the reader sees, measured by the browser
PROBE = """<pre id="probe"></pre><script>
const box = e => e ? e.getBoundingClientRect().bottom : null;
const strongs = [...document.querySelectorAll('strong')];
const q = t => strongs.find(s => s.textContent.startsWith(t));
const after = e => e ? (e.closest('p') || e).nextElementSibling : null;
document.getElementById('probe').textContent = JSON.stringify({
  viewport: window.innerHeight,
  text: document.body.innerText,
  ranking_bottom: box(q('Did HIR help ranking?')?.closest('p')),
  retrieval_bottom: box(q('Did HIR help retrieval?')?.closest('p')),
  outputs_bottom: box(after(q('Where are the outputs?'))),
  outputs_table: after(q('Where are the outputs?'))?.tagName,
  tables: document.querySelectorAll('table').length,
  images: [...document.images].map(i => [i.alt, i.naturalWidth]),
  nested_list_items: document.querySelectorAll('li > ul > li').length,
  code_spans: document.querySelectorAll('code').length,
});
</script>"""


def load_in_chromium(page: Path, tmp_path: Path) -> dict:
    """What the probe measured in ``page`` (a copy with the probe appended), rendered by Chromium."""
    probed = tmp_path / "probed.html"
    probed.write_text(page.read_text().replace("</body>", PROBE + "</body>"))
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}",
                           "--virtual-time-budget=5000", "--dump-dom", probed.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, flags=re.S)
    assert found and found.group(1), f"the probe did not run: {proc.stdout[-1000:]} {proc.stderr[-1000:]}"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (`make test` installs it: apt-get install chromium)")
def test_the_report_reads_as_a_report_in_a_browser(compose: Callable, tiny_graph: Path, tmp_path: Path) -> None:
    from tests.evaluation.tiny import TEST_START

    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1, event_timestamp=TEST_START)
    metrics = stage.run(compose("data=rees46", f"paths.graph_dir={tiny_graph}", TINY_TASK,
                                "eval.require_content=false", *FAST, stage="evaluate"))
    seen = load_in_chromium(tmp_path / "report" / "report.html", tmp_path)
    text = seen["text"]

    # rendered, not shown: no markdown syntax left in what the reader sees
    assert "**" not in text and "`" not in text and "\n- " not in text, text[:2000]
    assert seen["tables"] >= 5 and seen["code_spans"] > 0
    if metrics["ranking"].get("explanations"):
        assert seen["nested_list_items"] > 0  # "why this?": one sub-item per hierarchy level
    assert seen["images"] and all(width > 0 for _, width in seen["images"]), seen["images"]
    # the first screen answers the three questions
    for key in ("ranking_bottom", "retrieval_bottom", "outputs_bottom"):
        assert seen[key] is not None and seen[key] <= seen["viewport"], (key, seen[key], seen["viewport"])
    assert seen["outputs_table"] == "TABLE"
    lift = metrics["ranking"]["ne_lift"]
    assert f"{100 * lift['value']:+.2f}% [{100 * lift['ci'][0]:.2f}, {100 * lift['ci'][1]:.2f}]" in text
    best = metrics["retrieval"]["masked_new_to_user"]["hir_over_best_baseline"]
    assert f"the best baseline ({best['best_baseline']}, {best['best_value']:.4f})" in text
    assert str(tmp_path / "report" / "report.html") in text
    # the task in words, not JSON
    assert "Ranking task (funnel): every (user, product) pair with a view event" in text
    assert '{"kind"' not in text and "candidate_stages" not in text

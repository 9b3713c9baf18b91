"""The report's first screen (everything above "## Ranking": the three answers, the tasks, the
sources and their notes) reads as whole sentences: every paragraph ends as a sentence, and no
sentence stops on a word that needs another after it ("... learn from the train period only,
like it" did)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hir.data.snapshot import load_snapshot
from hir_evaluation.report.render import markdown
from hir_evaluation.sources.selection import Sources
from tests.evaluation.fixtures import write_export
from tests.evaluation.tiny import VAL_START

# words a sentence cannot end on: it would go on (prepositions, articles, conjunctions, pronouns)
DANGLING = {"a", "an", "the", "and", "or", "but", "as", "like", "than", "to", "of", "from", "with", "by", "for",
            "in", "on", "at", "into", "it", "its", "this", "that", "which"}
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def first_screen(report_md: str) -> str:
    """The text above the report's first section heading, markdown marks removed."""
    head = report_md.split("\n## ", 1)[0]
    return re.sub(r"\*\*|`|^> ", "", head, flags=re.M)


def unfinished_sentences(text: str) -> list[str]:
    """The sentences of ``text``'s prose paragraphs (tables and headings left out) that do not
    end with . ! ? or end on a word of ``DANGLING``."""
    bad = []
    for para in text.split("\n\n"):
        para = " ".join(para.split())
        if not para or para.startswith(("#", "|")):
            continue
        for sentence in SENTENCE_END.split(para):
            last = re.findall(r"[A-Za-z']+", sentence)[-1:]
            if not sentence.endswith((".", "!", "?")) or (last and last[0].lower() in DANGLING):
                bad.append(sentence)
    return bad


def test_the_checker_finds_a_cut_off_sentence() -> None:
    assert unfinished_sentences("Fine. The baselines learn from the train period only, like it.") == [
        "The baselines learn from the train period only, like it."]
    assert unfinished_sentences("Fine.\n\nnote: no period here") == ["note: no period here"]
    assert unfinished_sentences("One. Two?\n\n| a | b |\n\n# heading") == []


# a metrics.json shaped as `hir evaluate` writes it (the first screen's inputs only)
RANKING = {"task": {"kind": "funnel", "entity_type": "product", "candidate_stages": ["view"], "label_stage": "purchase",
                    "window": None},
           "arms": ["baseline", "hir", "content"], "fit_splits": ["val"], "rows": {"fit": 3, "test": 5},
           "positives": {"fit": 2, "test": 2}, "seeds": [0, 1],
           "bootstrap": {"resamples": 20, "unit": "user", "level": 0.95},
           "ne_lift": {"value": 0.012, "ci": [0.004, 0.02]}, "content_ne_lift": {"value": 0.02, "ci": [0.01, 0.03]}}
RETRIEVAL = {"task": {"entity_type": "product", "target_stage": "purchase"}, "users": 2, "ks": [10, 20, 50],
             "history_splits": ["train"], "hir": {"recall@20": 0.5},
             "hir_over_best_baseline": {"metric": "recall@20", "ratio": 0.9, "best_baseline": "lightgcn",
                                        "best_value": 0.55},
             "masked_new_to_user": {"hir": {"recall@20": 0.4},
                                    "hir_over_best_baseline": {"metric": "recall@20", "ratio": 1.1,
                                                               "best_baseline": "itemknn", "best_value": 0.36}}}


@pytest.mark.parametrize("verdict_lift", [None, 0.012, -0.05])
def test_the_first_screen_reads_whole_sentences(compose: Callable, tiny_graph: Path, tmp_path: Path,
                                                verdict_lift: float | None) -> None:
    # an export stamped before the test period: the retrieval arms learn from the train period
    # only, and the notes say so (with the file fallback's and the missing content's notes)
    write_export(tiny_graph, tmp_path / "embeddings", dim=4, levels=(2,), top_k=1, event_timestamp=VAL_START)
    cfg = compose("data=rees46", f"paths.graph_dir={tiny_graph}", "eval.require_content=false", stage="evaluate")
    sources = Sources(cfg, load_snapshot(tiny_graph), "product")
    assert sources.history_splits(None) == ["train"]
    ranking = RANKING | {"ne_lift": {"value": verdict_lift, "ci": [verdict_lift - 0.01, verdict_lift + 0.01]}
                         if verdict_lift is not None else {}}
    metrics = {"dataset": "tiny", "model_version": "fixture-v1", "ranking": ranking, "retrieval": RETRIEVAL,
               "sources": sources.record(), "outputs": {"report": str(tmp_path / "report" / "report.html")}}
    screen = first_screen(markdown(metrics, {}))

    assert "the retrieval baselines, like the HIR embeddings, learn from the train period only." in screen, screen
    assert len(sources.notes) >= 3  # fallback, no content, train-only history: all on the first screen
    assert unfinished_sentences(screen) == [], screen
